//! The decisions of the pipeline, made once for the real run and its plan:
//! `provision` performs a [`Decision`] (runs helm, or not) and `plan`
//! describes the same one, so a plan says what the real code path would do
//! by construction. The same holds for the [`Recovery`] of a half-done
//! record and for the [`Uninstall`] step of `deprovision`.

use provisioners_core::{Context, Result};

use super::adopt;
use super::builder::HelmRelease;
use super::drift::{self, DriftCheck};
use super::live;
use super::records;
use crate::objects::Seen;
use crate::storage::Revision;

/// Whether a step writes, or only reads and says what it would write:
/// kit's one write/dry-run mode, shared with the manifest leaf.
pub(super) use provisioners_kit::plan::Mode;

/// What `provision` does about the release's newest record, before any
/// helm runs.
#[derive(Debug)]
pub(super) enum Decision {
    /// Deployed with these very inputs: no helm. `checked` is the drift
    /// check (`None` with [`DriftPolicy::Ignore`](super::policy::DriftPolicy::Ignore)),
    /// whose verdict repairs nothing.
    Unchanged {
        revision: Revision,
        checked: Option<Box<DriftCheck>>,
    },
    /// Deployed with these very inputs, but drifted: `helm upgrade` with
    /// the same inputs repairs it.
    Repair {
        revision: Revision,
        checked: Box<DriftCheck>,
    },
    /// Installed or upgraded, after the [`Recovery`] of a half-done record.
    Change,
}

/// The decision for `latest`, the release's newest record, and
/// `digest`, the digest of the inputs now: one read of the stored
/// manifest and one per object when drift is checked.
///
/// A record that lacks the owner annotation our seal puts on it (with
/// owner keys) is not trusted by the real run to skip helm: it is
/// checked under the Lease, and sealed when it verifies, which changes
/// nothing of the release. A plan reads no Lease nor records to verify,
/// and shows the outcome for records that verify.
pub(super) async fn decide(
    release: &HelmRelease,
    cx: &Context,
    latest: Option<&Revision>,
    digest: Option<&str>,
    mode: Mode,
) -> Result<Decision> {
    let Some(revision) = latest.filter(|revision| revision.is_deployed_with(digest)) else {
        return Ok(Decision::Change);
    };
    if mode == Mode::Write
        && (records::unsealed_looking(cx, revision)
            || adopt::awaits_adoption(release, cx, revision).await?)
    {
        return Ok(Decision::Change);
    }
    // A record says "nothing to do" only once it is proven ours (with
    // owner keys): a forged newest record with our labels copied is
    // reported here, having cost a list, its own read and the Lease's.
    if provisioners_client::owner::OwnerKeys::of(cx).is_some() {
        live::proven_payload(release, cx, revision).await?;
    }
    let revision = revision.clone();
    let checked = drift::check_drift(release, cx, &revision)
        .await?
        .map(Box::new);
    Ok(match checked {
        Some(checked) if checked.verdict.repairs() => Decision::Repair { revision, checked },
        checked => Decision::Unchanged { revision, checked },
    })
}

/// What is done first about a record a dead helm (or an unfinished
/// uninstall) left half-done, before `helm upgrade --install`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Recovery {
    /// Nothing half-done.
    None,
    /// Left `pending-install`: uninstalled and its records removed, then
    /// installed again.
    Reinstall { pending: u32 },
    /// Left pending over a deployed revision: rolled back to `to` first.
    RollBack {
        pending: u32,
        status: String,
        to: u32,
    },
    /// Left pending with no deployed revision before it: its record is
    /// removed.
    Forget { pending: u32, status: String },
    /// An uninstall that is not finished: finished first, and the release
    /// installed again once its objects are gone.
    FinishUninstall { revision: u32 },
}

impl Recovery {
    /// The recovery of the release whose newest record is `latest`.
    pub(super) fn of(latest: &Revision) -> Recovery {
        let pending = latest.number;
        let status = latest.status.as_str();
        if status == "pending-install" {
            Recovery::Reinstall { pending }
        } else if latest.is_pending() {
            match latest.deployed_before {
                Some(to) => Recovery::RollBack {
                    pending,
                    status: status.to_owned(),
                    to,
                },
                None => Recovery::Forget {
                    pending,
                    status: status.to_owned(),
                },
            }
        } else if status == "uninstalling" || status == "uninstalled" {
            Recovery::FinishUninstall { revision: pending }
        } else {
            Recovery::None
        }
    }
}

/// What `deprovision` does with the release's newest record.
#[derive(Debug)]
pub(super) enum Uninstall {
    /// helm uninstalled it and the objects to wait for are known: the
    /// deletion gate.
    Waiting(Vec<Seen>),
    /// helm uninstalled it, but which of its objects to wait for was not
    /// remembered: they are looked up and remembered, then the gate.
    Remember,
    /// `helm uninstall`, then the gate.
    Run,
}

impl Uninstall {
    /// The uninstall step for `latest`.
    pub(super) fn of(latest: &Revision) -> Uninstall {
        match (&latest.uninstalled, latest.status == "uninstalled") {
            (Some(seen), true) => Uninstall::Waiting(seen.clone()),
            (None, true) => Uninstall::Remember,
            (_, false) => Uninstall::Run,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revision(number: u32, status: &str, deployed_before: Option<u32>) -> Revision {
        Revision {
            number,
            status: status.to_owned(),
            digest: None,
            repaired: None,
            secret: format!("sh.helm.release.v1.web.v{number}"),
            deployed_before,
            uninstalled: None,
            resource_version: None,
            owner: None,
        }
    }

    #[test]
    fn recovery_follows_the_status_of_the_newest_record() {
        assert_eq!(
            Recovery::of(&revision(1, "pending-install", None)),
            Recovery::Reinstall { pending: 1 }
        );
        assert_eq!(
            Recovery::of(&revision(4, "pending-upgrade", Some(2))),
            Recovery::RollBack {
                pending: 4,
                status: "pending-upgrade".to_owned(),
                to: 2
            }
        );
        assert_eq!(
            Recovery::of(&revision(3, "pending-rollback", None)),
            Recovery::Forget {
                pending: 3,
                status: "pending-rollback".to_owned()
            }
        );
        assert_eq!(
            Recovery::of(&revision(2, "uninstalling", None)),
            Recovery::FinishUninstall { revision: 2 }
        );
        for status in ["deployed", "failed", "superseded"] {
            assert_eq!(Recovery::of(&revision(5, status, Some(4))), Recovery::None);
        }
    }

    #[test]
    fn an_uninstall_waits_only_for_what_it_remembered() {
        let mut uninstalled = revision(2, "uninstalled", None);
        assert!(matches!(Uninstall::of(&uninstalled), Uninstall::Remember));
        uninstalled.uninstalled = Some(Vec::new());
        assert!(matches!(Uninstall::of(&uninstalled), Uninstall::Waiting(_)));
        assert!(matches!(
            Uninstall::of(&revision(2, "deployed", None)),
            Uninstall::Run
        ));
        // Remembered on a record helm then rewrote: uninstalled again.
        let mut failed = revision(3, "failed", None);
        failed.uninstalled = Some(Vec::new());
        assert!(matches!(Uninstall::of(&failed), Uninstall::Run));
    }
}
