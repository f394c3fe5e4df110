//! Owner keys on by default: the reconciler loads or creates the owner-key
//! Secret once, before its first tree runs, and gives the keys to every
//! tree (see [`Reconciler::owner_key_secret`]).

use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Context, Result};
use tokio::sync::OnceCell;

use super::Reconciler;

/// The name of the Secret that holds the owner keys unless
/// [`Reconciler::owner_key_secret`] says otherwise.
pub const DEFAULT_OWNER_KEY_SECRET: &str = "provisioners-owner-key";

/// Where a reconciler's owner keys come from.
#[derive(Debug)]
pub(super) struct KeySource {
    /// `None`: the application opted out ([`Reconciler::no_owner_keys`]).
    secret: Option<(Option<String>, String)>,
    /// The base context with the keys, once loaded.
    loaded: OnceCell<Context>,
}

impl Default for KeySource {
    fn default() -> Self {
        KeySource {
            secret: Some((None, DEFAULT_OWNER_KEY_SECRET.to_owned())),
            loaded: OnceCell::new(),
        }
    }
}

impl Reconciler {
    /// Keeps the owner keys in the Secret `name` (default
    /// [`provisioners-owner-key`](DEFAULT_OWNER_KEY_SECRET)) in `namespace`
    /// (`None`, the default: the client's default namespace, which in a pod
    /// is its service account's, the operator's own).
    ///
    /// Owner keys are on by default. Before its first tree runs, the
    /// reconciler reads the Secret, or creates it with a fresh random key
    /// (several replicas may race: the loser reads the winner's,
    /// [`OwnerKeys::load_or_create`]), and gives the keys to every tree, so
    /// that ownership stamps, helm records and fleet state are
    /// authenticated. Until that succeeds no tree runs: each reconcile
    /// returns the error (RBAC: `get` and `create` on Secrets in that
    /// namespace). Keys the application gave the context itself
    /// ([`Context::with_extension`]) are used as they are.
    ///
    /// Data written before the keys existed is adopted during the
    /// [adoption window](provisioners_client::owner::ADOPTION_WINDOW) after the
    /// Secret was created (see `docs/security.md`, "Turning keys on").
    pub fn owner_key_secret(mut self, namespace: Option<&str>, name: impl Into<String>) -> Self {
        self.owner_keys.secret = Some((namespace.map(str::to_owned), name.into()));
        self
    }

    /// Runs trees without owner keys (unless the context has its own):
    /// stamps, helm records and fleet state are then plain data that anyone
    /// who can write them can forge. Only for clusters where no tenant
    /// writes what the trees act on.
    pub fn no_owner_keys(mut self) -> Self {
        self.owner_keys.secret = None;
        self
    }

    /// Loads or creates the owner keys now (the first reconcile does it
    /// otherwise), e.g. to fail at start-up rather than on every reconcile.
    ///
    /// # Errors
    ///
    /// The Secret could not be read or created, or holds no usable key.
    pub async fn load_owner_keys(&self) -> Result<()> {
        self.tree_context().await.map(drop)
    }

    /// The context trees start from: the reconciler's, with the owner keys.
    pub(super) async fn tree_context(&self) -> Result<Context> {
        let Some((namespace, name)) = &self.owner_keys.secret else {
            return Ok(self.context.clone());
        };
        if OwnerKeys::of(&self.context).is_some() {
            return Ok(self.context.clone());
        }
        self.owner_keys
            .loaded
            .get_or_try_init(|| async {
                let client = self.context.client();
                let namespace = namespace
                    .clone()
                    .unwrap_or_else(|| client.default_namespace().to_owned());
                let keys = OwnerKeys::load_or_create(client, &namespace, name)
                    .await
                    .inspect_err(|error| {
                        tracing::error!(
                            secret = %format_args!("{namespace}/{name}"), %error,
                            "no owner keys, so no tree runs: the operator needs `get` and \
                             `create` on this Secret (or the application opts out with \
                             Reconciler::no_owner_keys)"
                        );
                    })?;
                if keys.adopting() {
                    tracing::info!(
                        secret = %format_args!("{namespace}/{name}"),
                        "owner keys are new: helm records and stamps written before them \
                         that name this operator's owners are adopted and signed once, each \
                         with a log line"
                    );
                } else {
                    tracing::info!(secret = %format_args!("{namespace}/{name}"), "owner keys loaded");
                }
                Ok(self.context.clone().with_extension(keys))
            })
            .await
            .cloned()
    }
}
