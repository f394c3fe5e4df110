//! Whether CRDs a pass applied are usable: `Established`, and their kinds
//! [served by API discovery](super::served). The one path both leaves take
//! after applying CRDs ([`Step::run`](super::Step::run) and the manifest
//! leaf), never waiting in the pass.
//!
//! # Requests
//!
//! `Established` is read from each CRD as given (the apply answer, or the
//! live CRD a pass left unchanged); one GET each for the others, a few at a
//! time. Discovery is asked (one GET of `/apis`) only for the established
//! CRDs this pass wrote, or that an earlier pass left unserved or not
//! established: a pass that wrote no CRD and awaits none makes no request
//! when its CRDs are established. A CRD seen served invalidates what the
//! cluster's [`Discovery`](crate::discovery::Discovery) held of its group,
//! so the next lookup of its kinds finds them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use provisioners_core::{Context, Error, Result};

use super::served::{self, Awaiting};
use crate::concurrent::in_order;

/// CRDs read at once to see whether they are established.
const READS: usize = 16;

/// One CRD for [`usable`]: as the pass left it, and whether the pass wrote
/// it.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    crd: &'a CustomResourceDefinition,
    written: bool,
}

impl<'a> Answer<'a> {
    /// A CRD this pass created or changed, as the apply answered it.
    #[must_use]
    pub fn written(crd: &'a CustomResourceDefinition) -> Self {
        Answer { crd, written: true }
    }

    /// A CRD this pass left as it was, as last read (its `status` says
    /// whether it is established; without one it is read).
    #[must_use]
    pub fn unchanged(crd: &'a CustomResourceDefinition) -> Self {
        Answer {
            crd,
            written: false,
        }
    }

    fn name(&self) -> &'a str {
        self.crd.metadata.name.as_deref().unwrap_or_default()
    }
}

/// What [`usable`] found, by CRD name, each list in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usable {
    /// `Established`, and API discovery lists every served version's
    /// resource (or the CRD was neither written nor awaited: not asked).
    pub served: Vec<String>,
    /// `Established`, but API discovery does not list all its served
    /// versions yet: clients cannot map its kinds.
    pub unserved: Vec<String>,
    /// Not `Established` yet.
    pub not_established: Vec<String>,
}

impl Usable {
    /// Whether the CRD `name` is `Established` (served or not).
    #[must_use]
    pub fn is_established(&self, name: &str) -> bool {
        self.served.iter().chain(&self.unserved).any(|n| n == name)
    }

    /// Whether every CRD is established and served.
    #[must_use]
    pub fn is_usable(&self) -> bool {
        self.unserved.is_empty() && self.not_established.is_empty()
    }
}

/// Which of `crds` are usable: `Established` (read from each CRD as given,
/// else by one GET), then, for the established ones this pass wrote or an
/// earlier pass still awaits, served by API discovery (one GET of `/apis`,
/// none when no CRD needs it). Remembers on the cluster the CRDs not yet
/// usable, so a later pass that leaves them unchanged still checks them.
///
/// # Errors
///
/// The API's, reading a CRD or discovery.
pub async fn usable(cx: &Context, crds: &[Answer<'_>]) -> Result<Usable> {
    let awaiting = cx.cluster().state::<Awaiting>();
    // Until discovery is seen serving them: a pass that fails below leaves
    // them to the next one, which may not write them again.
    for answer in crds.iter().filter(|answer| answer.written) {
        awaiting.set(answer.name(), true);
    }
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    let reads = crds
        .iter()
        .map(|answer| {
            let api = api.clone();
            async move {
                if is_established(answer.crd) {
                    return Ok(true);
                }
                let name = answer.name();
                match api.get_opt(name).await {
                    Ok(live) => Ok(live.is_some_and(|live| is_established(&live))),
                    Err(e) => Err(Error::kube(
                        format_args!(
                            "reading CustomResourceDefinition {name} to see whether it is \
                             established"
                        ),
                        e,
                    )),
                }
            }
        })
        .collect();
    let established = in_order(reads, READS).await;
    // Per CRD: what it is, or `None` until discovery answers.
    let mut states: Vec<Option<State>> = Vec::with_capacity(crds.len());
    let mut check = Vec::new();
    for (answer, established) in crds.iter().zip(established) {
        let name = answer.name();
        states.push(if !established? {
            awaiting.set(name, true);
            Some(State::NotEstablished)
        } else if awaiting.contains(name) {
            check.push((name, answer.crd));
            None
        } else {
            Some(State::Served)
        });
    }
    let unserved = served::unserved(cx, &check).await?;
    let mut usable = Usable::default();
    for (answer, state) in crds.iter().zip(states) {
        let name = answer.name();
        let state = state.unwrap_or_else(|| {
            let is_unserved = unserved.iter().any(|u| u == name);
            awaiting.set(name, is_unserved);
            if is_unserved {
                State::Unserved
            } else {
                State::Served
            }
        });
        match state {
            State::Served => usable.served.push(name.to_owned()),
            State::Unserved => usable.unserved.push(name.to_owned()),
            State::NotEstablished => usable.not_established.push(name.to_owned()),
        }
    }
    Ok(usable)
}

/// Whether `crd`'s `Established` condition is `True`.
pub fn is_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// What became of one CRD.
#[derive(Clone, Copy)]
enum State {
    Served,
    Unserved,
    NotEstablished,
}
