//! One subtree of provisioners on many clusters, rolled out in waves with a
//! failure budget.
//!
//! A [`Fleet`] is a set of member clusters ([`Members`]: a list, or the
//! kubeconfig Secrets Cluster API writes, selected by label) and a function
//! from a [`Member`] to its subtree. Each member's subtree runs as a named
//! remote node of `provisioners-remote` (`fleet/<member>/<subtree>`), so the
//! remote's trust rules, its cluster cache and per-cluster health apply.
//!
//! **A pass never waits on a member.** It runs at most
//! [`Rollout::concurrency`] member passes at once, each one remote subtree
//! pass (which yields when it is not done), writes what changed, and yields
//! with a summary: `wave 2 of 5: 18 done, 4 in flight, 1 failed of budget 3`.
//!
//! **The rollout rules** ([`Rollout`]): members are ordered (canaries
//! first, then an explicit order, a label's value or their name) and cut
//! into waves. A wave starts once the one before it is complete (every
//! member done, or failed) and has soaked. A member still yielding past the
//! progress timeout counts as failed, as does one that fails with an error
//! a retry will not fix (transient errors are waited for, until the
//! timeout). When more members have failed than the budget allows, the
//! fleet halts: no member starts, failed members keep what they had (there
//! is no rollback), and the pass yields `halted: 2 members failed (m3, m7),
//! budget 1; fix them or raise the budget`. Failed members are retried on
//! every pass, so fixing the cause (or raising the budget) resumes the
//! rollout. A rollout whose waves are all complete, with failures within
//! the budget, is `Ok`.
//!
//! **Revisions.** The fleet's [revision](Fleet::revision) is given by the
//! user: a digest of what the subtree is built from (chart versions, values,
//! manifests) or a release tag. A member done at the current revision is a
//! no-op: no request to its cluster. A new revision rolls out wave by wave.
//! A done member is provisioned again after [`DEFAULT_RESYNC`] (an hour;
//! [`Fleet::resync_after`]) to correct drift, within the in-flight bound.
//!
//! **State.** Each member's state survives restarts in one ConfigMap per
//! fleet and owner on the context's cluster,
//! `fleet-<owner>-<name>-<digest of the owner's identity>` (kind,
//! namespace, name and UID: two owners never share it; `fleet-<name>`
//! without an owner; [`Fleet::state_name`]) in [`Fleet::state_in`]'s
//! namespace: one key per member, compact JSON (`digest`, `state` pending /
//! in-flight / done / failed / abandoned / gone, `since` RFC 3339, the last
//! `error` redacted and cut to 512 characters, `wave`). A pass that changes
//! nothing writes nothing; writes are merge patches of the changed keys
//! under a `resourceVersion` precondition, so two passes do not lose each
//! other's updates. A value that is not a record makes that member pending.
//! With owner keys each record is signed, and bound to the current epoch of
//! the fleet's ledger (a Lease of the same name that only the operator
//! writes, advanced on every write, every record re-signed in it): a
//! record someone else wrote, or a member's own earlier record put back,
//! makes that member pending too. The state of the former name
//! (`fleet-<owner>-<name>`) is moved once, as far as it is proven this
//! owner's. A restored or re-created owner (a new UID) takes over its
//! predecessor's fleet only when told to ([`Fleet::take_over_from`]).
//!
//! **Members that leave** (their Secret leaves the selector or is deleted,
//! they leave the list, or are listed as [leaving](Member::leaving)) have
//! their subtree deprovisioned before their key is dropped, following
//! [`Fleet::unreachable`] when their cluster does not answer, unless the
//! fleet [orphans](Fleet::orphan_departed) them. A member that leaves the
//! fleet while failed still counts against the failure budget
//! (docs/fleet.md).
//! A fleet holds at most [`MAX_MEMBERS`] members (the ConfigMap's 1 MiB).
//!
//! **Deprovision** goes in reverse waves, the last first, and is `Ok` only
//! once every member's subtree is gone (or abandoned); a member whose
//! cluster does not answer follows [`Fleet::unreachable`] (its remote's
//! [`UnreachablePolicy`]) and does not hold the others. Then the state
//! ConfigMap is deleted, and its ledger.
//!
//! **Plan**: which members would change, in which wave, with the first
//! [`PLAN_DETAIL`] members' plans below the fleet node.
//!
//! See also `docs/fleet.md` for the rules with a diagram.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use provisioners_core::{Cluster, Context, Provisioner};
//! use provisioners_fleet::{Budget, Fleet, Members, Rollout};
//! # use provisioners_testing::Noop;
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let cx = Context::new(provisioners_client::infer().await?);
//! // Every Cluster API cluster in namespace `clusters` labelled `env=prod`.
//! let members = Members::from_secrets("clusters").selector("env=prod");
//! let fleet = Fleet::new("addons", members, |member| {
//!     Box::new(Noop::new(format!("addons-{}", member.name()))) as Box<dyn Provisioner>
//! })
//! .revision("addons-1.4.2")
//! .state_in("clusters")
//! .rollout(
//!     Rollout::new()
//!         .canary_label("ring", "canary")
//!         .wave_size(10)
//!         .concurrency(5)
//!         .budget(Budget::Count(1))
//!         .next_wave_after(Duration::from_secs(300)),
//! );
//! // Each call is one pass: it yields until the rollout is complete.
//! match cx.provision(&fleet).await {
//!     Ok(()) => println!("every wave rolled out"),
//!     Err(error) if error.is_yield() => println!("{error}"), // wave 2 of 5: ...
//!     Err(error) => return Err(error),
//! }
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod depart;
mod fleet;
mod member;
mod node;
mod pass;
mod plan;
mod record;
mod rollout;
mod schedule;
mod state;

pub use fleet::{DEFAULT_RESYNC, DEFAULT_REVISION, Fleet};
pub use member::{
    CLUSTER_API_SECRET_TYPE, CLUSTER_NAME_LABEL, KUBECONFIG_KEY, MAX_MEMBERS, Member, Members,
};
pub use plan::PLAN_DETAIL;
pub use provisioners_remote::UnreachablePolicy;
pub use record::MemberState;
pub use rollout::{
    Budget, DEFAULT_CONCURRENCY, DEFAULT_PROGRESS_TIMEOUT, DEFAULT_WAVE_SIZE, Rollout,
};
pub use state::FLEET_LABEL;
