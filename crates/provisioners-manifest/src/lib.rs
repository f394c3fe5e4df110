//! [`Manifest`] and [`SingleObject`]: Kubernetes objects as provisioners, applied
//! with server-side apply.
//!
//! A `Manifest` takes multi-document YAML (a string, a file, or a directory
//! read recursively in path order) or [`DynamicObject`](kube::api::DynamicObject)s;
//! a `SingleObject` takes one typed object. Both:
//!
//! - resolve kinds through API discovery, cached per group-version in the
//!   cluster's state ([`Cluster::state`](provisioners_core::Cluster::state):
//!   every manifest on a cluster shares it, nothing to pass around), so an
//!   aggregated API that is down only affects its own objects;
//! - apply under the context's field manager, in order: Namespaces, CRDs,
//!   cluster RBAC, built-in kinds, custom resources; each step concurrently
//!   with a bound; a re-provision that would change nothing is one LIST
//!   per kind and namespace (objects carry a digest annotation,
//!   `provisioners.dev/applied-digest`), not one apply per object;
//! - read whether the CRDs they apply are established (the apply answer,
//!   else one GET; never a wait in the pass), yield, naming the CRD, while
//!   one is not, and fail with
//!   [`Invalid`](provisioners_core::ErrorKind::Invalid) for a kind that
//!   stays unknown past a deadline;
//! - stamp everything they apply with the owner and node (see
//!   [`OWNER_ANNOTATION`]), refuse to take over an object that exists
//!   without that stamp (unless told to adopt it), and only ever delete a
//!   live object that carries it, with a precondition on its UID;
//! - optionally wait for readiness ([`Manifest::ready_timeout`]: a yield while not
//!   ready, [`Timeout`](provisioners_core::ErrorKind::Timeout) past the
//!   deadline) and prune objects that left the manifest;
//! - deprovision in reverse order, yielding until everything is gone;
//!   objects the system protects or that are annotated to be kept are
//!   released (the stamp removed), not deleted.
//!
//! Bad input is an `Invalid` error naming the file, line and document, the
//! object and the field. Requests go through the cluster's client, whose
//! [`ClientPolicy`](provisioners_client::ClientPolicy) bounds and briefly
//! retries them; what still fails is an error of the kind
//! [`Error::kube`](provisioners_core::Error::kube) gives it
//! ([`Unavailable`](provisioners_core::ErrorKind::Unavailable) for
//! connections, 429 and 5xx: retry later).
//!
//! # Permissions
//!
//! Besides what the objects themselves need (`get`, `list`, `patch`,
//! `delete` on their kinds), a manifest that applies CRDs needs `list` and
//! `watch` on `customresourcedefinitions` (to wait for them to be
//! established), and a pruning one `get`, `patch` and `delete` on the
//! inventory ConfigMaps.
//!
//! # Planning
//!
//! [`Context::plan`](provisioners_core::Context::plan) (and
//! [`plan_deprovision`](provisioners_core::Context::plan_deprovision)) asks
//! a manifest what its provision (or deprovision) would do now, without
//! doing it: a [`Plan`](provisioners_core::Plan) node of kind `manifest`
//! (`resource` for a [`SingleObject`]) with one object per object, in the order
//! provision would apply them (tier by tier, then what prune would delete).
//! Planning only reads and sends server-side applies with `dryRun=All`: it
//! writes no object, no inventory, no namespace.
//!
//! | live object | action |
//! |---|---|
//! | missing | create (dry-run, so schema and admission errors show; not dry-run inside a namespace the manifest creates first) |
//! | in a namespace that does not exist and that the manifest does not create | unknown (an earlier node may create it) |
//! | ours, and the no-op check would skip it | no change (not dry-run: a plan of an unchanged manifest costs what an unchanged provision does) |
//! | ours, otherwise | update with the fields the dry-run answer changes (our stamp left out), or no change |
//! | an immutable field changes | replace, saying what the [`ReplacePolicy`] would do |
//! | not ours, `adopt(false)` | refuse, with provision's reason |
//! | not ours, `adopt(true)` | adopt, with the fields that change |
//! | kind not served, defined by a CRD of the manifest | create |
//! | kind not served otherwise | unknown (provision would wait for it) |
//! | in the inventory, no longer in the manifest, ours (prune) | delete (`pruned: no longer in the manifest`) |
//!
//! A deprovision plan lists, in deprovision's order, what it would delete,
//! release (kept objects: an update, the stamp removed) or refuse to touch
//! (an object of the manifest that is not ours); objects already gone are
//! left out. A Secret's values never appear: changes to its `data` are
//! masked, and a Secret the server refuses (in a plan or at provision) is
//! reported without the server's message, which may quote its data.
//! Input that provision would refuse fails the plan with the same error;
//! failures that pass (the cluster unreachable, discovery failing) are
//! transient errors.
//!
//! ```no_run
//! use provisioners_core::{Cluster, Context};
//! use provisioners_manifest::Manifest;
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let cx = Context::new(provisioners_client::infer().await?).with_field_manager("my-operator");
//! let monitoring = Manifest::from_path("monitoring", "deploy/kube-prometheus").prune(true);
//! let plan = cx.plan(&monitoring).await?;
//! println!("{plan}"); // `{plan:#}` lists the unchanged objects too
//! println!("{} ({})", plan.summary(), plan.digest());
//! if plan.has_changes() {
//!     cx.provision(&monitoring).await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Immutable fields
//!
//! A change the API server refuses because a field may not change (a Job's
//! `spec.template`, a Deployment's `spec.selector`, a Service's cluster IP,
//! the data of an `immutable` ConfigMap or Secret) fails provision with an
//! [`Invalid`](provisioners_core::ErrorKind::Invalid) error by default.
//! [`Manifest::replace`]`(`[`ReplacePolicy::Recreate`]`)` (or the annotation
//! [`REPLACE_POLICY_ANNOTATION`]` = recreate` on one object) deletes such an
//! object and creates it again, gated like every deletion: only an object
//! stamped by this owner (or adopted), never one annotated to be kept, with
//! a UID precondition, yielding until the old one is gone.
//!
//! Parsing uses `serde-saphyr` (the parser `kube` uses) with its budgets on:
//! alias bombs, deep nesting and oversized input are refused.
//!
//! See [`provisioners-core`](provisioners_core) for the trait and context.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use provisioners_core::{Cluster, Context};
//! use provisioners_manifest::Manifest;
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let cx = Context::new(provisioners_client::infer().await?).with_field_manager("my-operator");
//! let app = Manifest::from_yaml(
//!     "app",
//!     r#"
//! apiVersion: v1
//! kind: Namespace
//! metadata:
//!   name: app
//! ---
//! apiVersion: v1
//! kind: ConfigMap
//! metadata:
//!   name: settings
//!   namespace: app
//! data:
//!   level: debug
//! "#,
//! )
//! .prune(true)
//! .ready_timeout(Duration::from_secs(120));
//! cx.provision(&app).await?;
//! cx.deprovision(&app).await?; // a yield until the namespace is gone
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod discovery;
#[cfg(test)]
mod fuzz_tests;
mod leaf;
mod object;
mod ownership;
mod single_object;
mod source;
mod unchanged;
mod walk;

pub use leaf::{Manifest, REPLACE_POLICY_ANNOTATION, ReplacePolicy};
pub use ownership::{DELETION_POLICY_ANNOTATION, INVENTORY_LABEL, OWNER_ANNOTATION, stamped_by};
pub use single_object::SingleObject;
