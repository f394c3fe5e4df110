//! Who a release's records are sealed for: the context's owner and its
//! keys, read by the seal ([`records`](super::records)) and by the
//! adoption of records written before the keys ([`adopt`](super::adopt)).

use provisioners_client::owner::OwnerKeys;
use provisioners_core::Context;

/// Who seals the records of a run, taken from the pass's context before
/// the run starts.
pub(super) struct Sealing {
    pub(super) keys: Option<OwnerKeys>,
    pub(super) owner: Option<String>,
}

/// The owner a release is held for: the context's explicit
/// [`Owner`](provisioners_core::Owner), if any (a tree's own identity
/// follows its root's name, and a release does not).
pub(super) fn release_owner(cx: &Context) -> Option<String> {
    cx.owner().map(provisioners_core::Owner::identity)
}

/// The sealing of runs started from `cx`.
pub(super) fn sealing(cx: &Context) -> Sealing {
    Sealing {
        keys: OwnerKeys::of(cx).cloned(),
        owner: release_owner(cx),
    }
}
