//! Pages of custom resources that their size cannot wedge.
//!
//! The CRD gate and the migration read whole custom resources, which
//! tenants may write, against the client policy's response cap (64 MiB by
//! default): a page of 500 objects of ~1.4 MB each is refused every time,
//! and a fixed page size would refuse it on every pass. So a [`Pager`]
//! halves its page when an answer is over the cap, and keeps the smaller
//! size for the rest of the LIST; a single object that alone is over the
//! cap is named (from a metadata-only LIST, which it cannot inflate) so the
//! caller can say which.

use kube::api::{Api, DynamicObject, ListParams, ObjectList};

/// Reads one LIST page after another, halving the page on a response over
/// the client policy's cap.
#[derive(Debug)]
pub(super) struct Pager {
    limit: u32,
}

/// Why a page could not be read.
#[derive(Debug)]
pub(super) enum PageError {
    /// The LIST failed.
    List(kube::Error),
    /// The next object alone is over the response cap: its name, when a
    /// metadata-only LIST could tell it.
    TooLarge(Option<String>),
}

impl Pager {
    /// Pages of at most `limit` objects, fewer once an answer was too large.
    pub(super) fn new(limit: u32) -> Pager {
        Pager {
            limit: limit.max(1),
        }
    }

    /// The page size now.
    pub(super) fn limit(&self) -> u32 {
        self.limit
    }

    /// The page of `api` that starts at `token` (the first without one).
    pub(super) async fn page(
        &mut self,
        api: &Api<DynamicObject>,
        token: Option<&str>,
    ) -> Result<ObjectList<DynamicObject>, PageError> {
        loop {
            let mut params = ListParams::default().limit(self.limit);
            if let Some(token) = token {
                params = params.continue_token(token);
            }
            match api.list(&params).await {
                Ok(page) => return Ok(page),
                Err(error) if provisioners_client::is_response_too_large(&error) => {
                    if self.limit == 1 {
                        let name = api
                            .list_metadata(&params)
                            .await
                            .ok()
                            .and_then(|page| page.items.into_iter().next())
                            .and_then(|item| item.metadata.name);
                        return Err(PageError::TooLarge(name));
                    }
                    self.limit /= 2;
                    tracing::debug!(
                        resource = %api.resource_url(),
                        limit = self.limit,
                        "a page of custom resources was over the response cap; halving it"
                    );
                }
                Err(error) => return Err(PageError::List(error)),
            }
        }
    }
}
