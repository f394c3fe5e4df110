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
use kube::api::{Api, ApiResource};
use provisioners_client::wake::Wake;
use provisioners_core::{Context, Error, Result};

use super::served::{self, Awaiting};
use crate::concurrent::in_order;
use crate::watch::{Scope, Watches};

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
    /// Whether the tree's [`Wake`] (when a controller set one) is registered
    /// at the next change of every CRD in
    /// [`not_established`](Usable::not_established), in the cluster's
    /// shared watch of CRDs ([`crate::watch`]): the change that establishes
    /// it runs the tree again. A yield that waits on nothing else may then
    /// [promise](Wake::promise) the wake instead of being polled. `false`
    /// when any CRD waits to be served (discovery has no watch), or without
    /// a wake or a watch that took it.
    pub woken: bool,
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
                let version = answer.crd.metadata.resource_version.clone();
                if is_established(answer.crd) {
                    return Ok((true, version));
                }
                let name = answer.name();
                match api.get_opt(name).await {
                    Ok(live) => Ok(match live {
                        Some(live) => (is_established(&live), live.metadata.resource_version),
                        None => (false, None),
                    }),
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
    // (name, resourceVersion read) of the CRDs not established.
    let mut waiting = Vec::new();
    for (answer, established) in crds.iter().zip(established) {
        let name = answer.name();
        let (established, version) = established?;
        states.push(if !established {
            awaiting.set(name, true);
            waiting.push((name, version));
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
    usable.woken = usable.unserved.is_empty() && wake_on_change(cx, &waiting);
    Ok(usable)
}

/// Registers the tree's wake (if set) at the next change of each CRD of
/// `waiting` ((name, resourceVersion read)) in the cluster's shared watch
/// of CRDs (metadata only: the event is what matters, the next pass reads
/// the CRD). `true` only when every one is covered: the watch holding the
/// CRD at the version read (one already past it is polled: its event came
/// before the wake was registered), or still in its first list
/// (whose end wakes every waiter). No
/// request; `false` for an empty list.
fn wake_on_change(cx: &Context, waiting: &[(&str, Option<String>)]) -> bool {
    let Some(wake) = Wake::of(cx) else {
        return false;
    };
    if waiting.is_empty() {
        return false;
    }
    let resource = ApiResource::erase::<CustomResourceDefinition>(&());
    let Some(watched) =
        Watches::of(cx.cluster()).watch(cx.client(), &resource, &Scope::all().metadata_only())
    else {
        return false;
    };
    let objects: Vec<(Option<String>, String)> = waiting
        .iter()
        .map(|(name, _)| (None, (*name).to_owned()))
        .collect();
    if !watched.wake_on_change(&objects, wake) {
        return false;
    }
    let mut covered = true;
    let mut moved = false;
    for (name, read) in waiting {
        match watched.get(None, name) {
            Some(Some(held)) => {
                moved |=
                    crate::watch::newer(held.metadata.resource_version.as_deref(), read.as_deref());
            }
            // Not in the synced watch: no event is sure to come.
            Some(None) => covered = false,
            // Still in its first list (the wake was taken): the end of the
            // list wakes every waiter.
            None => {}
        }
    }
    // A store already past the read: polled, not woken at once (a pass
    // that keeps reading an older copy would be woken in a loop).
    covered && !moved
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
