//! What a tree would do, without doing it: the [`Plan`] tree.
//!
//! [`Context::plan`](crate::Context::plan) asks every node of a tree what
//! its provision (or deprovision) would change, and returns a [`Plan`] that
//! mirrors the tree: one node per provisioner, in the order they would run,
//! each with the operation it would perform and, for leaves, one
//! [`ObjectPlan`] per Kubernetes object with its [`Action`] and the fields
//! that would change. Planning never writes: leaves plan from dry-runs and
//! reads only.
//!
//! A plan reads like `kubectl diff` or a terraform plan through
//! [`Display`](std::fmt::Display), serialises to JSON through `serde`, and
//! has a stable [`digest`](Plan::digest) that an approval can pin.
//!
//! ```
//! use provisioners_core::plan::{Action, FieldChange, ObjectPlan, Plan};
//! use provisioners_core::Operation;
//! use serde_json::json;
//!
//! let plan = Plan::new("platform", Operation::Provision, "manifest")
//!     .with_object(ObjectPlan::new("v1", "ConfigMap", Some("apps"), "settings", Action::Create))
//!     .with_object(
//!         ObjectPlan::new("apps/v1", "Deployment", Some("apps"), "web", Action::Update)
//!             .with_changes(vec![FieldChange::new(
//!                 "spec.replicas",
//!                 Some(json!(1)),
//!                 Some(json!(3)),
//!             )]),
//!     );
//! assert_eq!(plan.counts().create, 1);
//! assert_eq!(plan.counts().update, 1);
//! assert!(plan.to_string().contains("spec.replicas: 1 -> 3"));
//! assert!(plan.digest().starts_with("sha256:"));
//! ```

use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::Operation;

/// What is shown in place of a Secret's data.
pub const MASKED: &str = "(sensitive value)";

/// What one node of a tree would do: a node of the plan tree.
///
/// Leaves fill [`objects`](Plan::objects) (and, for a Helm release,
/// [`release`](Plan::release)); groups fill [`children`](Plan::children) in
/// the order the children would run. A node that cannot say what it would
/// do is [`unknown`](Plan::unknown_reason), with the reason; the rest of the
/// tree is still planned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[must_use]
pub struct Plan {
    name: String,
    operation: Operation,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unknown: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    release: Option<ReleasePlan>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    objects: Vec<ObjectPlan>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    children: Vec<Plan>,
}

impl Plan {
    /// The plan of the node `name`, which would perform `operation`; `kind`
    /// says what the node is (`"manifest"`, `"helm"`, `"serial"`, ...).
    pub fn new(name: impl Into<String>, operation: Operation, kind: impl Into<String>) -> Self {
        Plan {
            name: name.into(),
            operation,
            kind: kind.into(),
            cluster: None,
            note: None,
            unknown: None,
            release: None,
            objects: Vec::new(),
            children: Vec::new(),
        }
    }

    /// The plan of a node that cannot say what it would do, and why.
    pub fn unknown(
        name: impl Into<String>,
        operation: Operation,
        reason: impl Into<String>,
    ) -> Self {
        Plan::new(name, operation, "unknown").with_unknown(reason)
    }

    /// Marks this node unknown, with the reason.
    pub fn with_unknown(mut self, reason: impl Into<String>) -> Self {
        self.unknown = Some(reason.into());
        self
    }

    /// The id of the cluster this node plans on, when it is not the
    /// parent's (a remote subtree).
    pub fn with_cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = Some(cluster.into());
        self
    }

    /// A line for a reader: why the node does what it does (e.g. "condition
    /// is false").
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    /// The Helm release this node would install, upgrade or remove.
    pub fn with_release(mut self, release: ReleasePlan) -> Self {
        self.release = Some(release);
        self
    }

    /// Adds one object.
    pub fn with_object(mut self, object: ObjectPlan) -> Self {
        self.objects.push(object);
        self
    }

    /// Adds objects.
    pub fn with_objects(mut self, objects: impl IntoIterator<Item = ObjectPlan>) -> Self {
        self.objects.extend(objects);
        self
    }

    /// Adds a child, after the ones already there.
    pub fn with_child(mut self, child: Plan) -> Self {
        self.children.push(child);
        self
    }

    /// Adds children, in order.
    pub fn with_children(mut self, children: impl IntoIterator<Item = Plan>) -> Self {
        self.children.extend(children);
        self
    }

    /// Says what the node is (a wrapper that plans through its child may
    /// name itself: a `Resource` is a `manifest` node of one object).
    pub fn with_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into();
        self
    }

    /// Renames the node (the context names every node after its provisioner).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The node's name: one segment of its path.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the node would do.
    pub fn operation(&self) -> Operation {
        self.operation
    }

    /// What the node is: `"manifest"`, `"helm"`, `"serial"`, ...
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The cluster the node plans on, when it is not its parent's.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// A line for a reader, if any.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Why the node's plan is unknown, if it is.
    pub fn unknown_reason(&self) -> Option<&str> {
        self.unknown.as_deref()
    }

    /// The Helm release, for a Helm node.
    pub fn release(&self) -> Option<&ReleasePlan> {
        self.release.as_ref()
    }

    /// The node's own objects, in the order they would be applied.
    pub fn objects(&self) -> &[ObjectPlan] {
        &self.objects
    }

    /// The node's children, in the order they would run.
    pub fn children(&self) -> &[Plan] {
        &self.children
    }

    /// Every node of the tree with its path (`platform/components/metrics`),
    /// depth first, in the order the nodes would run.
    pub fn nodes(&self) -> Vec<(String, &Plan)> {
        let mut out = Vec::new();
        self.walk(None, &mut out);
        out
    }

    fn walk<'a>(&'a self, parent: Option<&str>, out: &mut Vec<(String, &'a Plan)>) {
        let path = match parent {
            Some(parent) => format!("{parent}/{}", self.name),
            None => self.name.clone(),
        };
        out.push((path.clone(), self));
        for child in &self.children {
            child.walk(Some(&path), out);
        }
    }

    /// The node at `path` (`platform/components/metrics`), if there is one.
    pub fn find(&self, path: &str) -> Option<&Plan> {
        self.nodes()
            .into_iter()
            .find_map(|(p, node)| (p == path).then_some(node))
    }

    /// Every object of the tree, with the path of its node.
    pub fn all_objects(&self) -> Vec<(String, &ObjectPlan)> {
        self.nodes()
            .into_iter()
            .flat_map(|(path, node)| node.objects.iter().map(move |o| (path.clone(), o)))
            .collect()
    }

    /// How many objects, releases and nodes of the tree would do what.
    pub fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        for (_, node) in self.nodes() {
            if node.unknown.is_some() {
                counts.unknown_nodes += 1;
            }
            if let Some(release) = &node.release {
                match release.action {
                    ReleaseAction::Install => counts.install += 1,
                    ReleaseAction::Upgrade => counts.upgrade += 1,
                    ReleaseAction::Drift => counts.drift += 1,
                    ReleaseAction::Uninstall => counts.uninstall += 1,
                    ReleaseAction::NoChange | ReleaseAction::Absent => {}
                }
            }
            for object in &node.objects {
                match object.action {
                    Action::Create => counts.create += 1,
                    Action::Update => counts.update += 1,
                    Action::NoChange => counts.no_change += 1,
                    Action::Delete => counts.delete += 1,
                    Action::Replace => counts.replace += 1,
                    Action::Adopt => counts.adopt += 1,
                    Action::Refuse => counts.refuse += 1,
                    Action::Unknown => counts.unknown += 1,
                }
            }
        }
        counts
    }

    /// Whether applying the plan would change anything, or might (an unknown
    /// node or object counts as a change: nobody can say it is not one).
    pub fn has_changes(&self) -> bool {
        self.counts().has_changes()
    }

    /// One line: what the plan would do, e.g. `3 to create, 1 to update, 12
    /// unchanged`.
    pub fn summary(&self) -> String {
        self.counts().to_string()
    }

    /// A stable digest of the plan, `sha256:` and 64 hex digits.
    ///
    /// It covers everything the plan says, in a canonical form (object keys
    /// sorted), so the same plan has the same digest in every process and
    /// release of this crate with the same plan format, and any change to
    /// what would be done changes it. A Secret's values are masked before
    /// they reach a plan, so the digest covers *that* a Secret's field
    /// changes, not to what: pinning a digest does not pin a Secret's new
    /// value.
    pub fn digest(&self) -> String {
        let value = serde_json::to_value(self).unwrap_or(Value::Null);
        let mut hasher = Sha256::new();
        hasher.update(b"provisioners.dev/plan/v1\n");
        canonical(&value, &mut hasher);
        let digest = hasher.finalize();
        let mut out = String::with_capacity(7 + 64);
        out.push_str("sha256:");
        for byte in digest.iter() {
            let _ = write!(out, "{byte:02x}");
        }
        out
    }
}

/// Feeds `value` to `hasher` with object keys in order, whatever order the
/// map kept them in.
fn canonical(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            hasher.update(b"{");
            for key in keys {
                hasher.update(serde_json::to_string(key).unwrap_or_default().as_bytes());
                hasher.update(b":");
                canonical(&map[key], hasher);
                hasher.update(b",");
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for item in items {
                canonical(item, hasher);
                hasher.update(b",");
            }
            hasher.update(b"]");
        }
        other => hasher.update(other.to_string().as_bytes()),
    }
}

/// What would happen to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// It does not exist and would be created.
    Create,
    /// It exists and would change: see [`ObjectPlan::changes`].
    Update,
    /// It exists and would not change.
    NoChange,
    /// It would be deleted: pruned (no longer in the package) or
    /// deprovisioned.
    Delete,
    /// A field that cannot change would change: it would be deleted and
    /// created again, or provisioning would fail (see the reason).
    Replace,
    /// It exists without an owner and would be taken over.
    Adopt,
    /// It belongs to someone else: provisioning would refuse to touch it.
    Refuse,
    /// What would happen cannot be known before earlier steps run (e.g. its
    /// kind is defined by a CRD not yet installed); see the reason.
    Unknown,
}

impl Action {
    /// The word for the action: `create`, `update`, `no change`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::NoChange => "no change",
            Action::Delete => "delete",
            Action::Replace => "replace",
            Action::Adopt => "adopt",
            Action::Refuse => "refuse",
            Action::Unknown => "unknown",
        }
    }

    /// The diff marker: `+`, `~`, `=`, `-`, `-/+`, `>`, `!`, `?`.
    pub fn marker(self) -> &'static str {
        match self {
            Action::Create => "+",
            Action::Update => "~",
            Action::NoChange => "=",
            Action::Delete => "-",
            Action::Replace => "-/+",
            Action::Adopt => ">",
            Action::Refuse => "!",
            Action::Unknown => "?",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What would happen to one Kubernetes object.
///
/// A Secret's (`v1` `Secret`) `data` and `stringData` values never reach an
/// object plan: [`with_changes`](ObjectPlan::with_changes) replaces them
/// with [`MASKED`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectPlan {
    api_version: String,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    name: String,
    action: Action,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    changes: Vec<FieldChange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl ObjectPlan {
    /// `action` on the object `kind` `namespace/name` of `api_version`.
    pub fn new(
        api_version: impl Into<String>,
        kind: impl Into<String>,
        namespace: Option<&str>,
        name: impl Into<String>,
        action: Action,
    ) -> Self {
        ObjectPlan {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(str::to_owned),
            name: name.into(),
            action,
            changes: Vec::new(),
            reason: None,
        }
    }

    /// The fields that would change; a Secret's values are masked.
    pub fn with_changes(mut self, changes: Vec<FieldChange>) -> Self {
        self.changes = changes;
        if self.is_secret() {
            for change in &mut self.changes {
                if is_secret_data(&change.path) {
                    change.mask();
                }
            }
        }
        self
    }

    /// Why the action: the immutable field, the other owner, what is unknown.
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// The object's `apiVersion`.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// The object's kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The object's namespace; `None` for a cluster-scoped object.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What would happen to it.
    pub fn action(&self) -> Action {
        self.action
    }

    /// The fields that would change (for [`Action::Update`] and
    /// [`Action::Replace`]).
    pub fn changes(&self) -> &[FieldChange] {
        &self.changes
    }

    /// Why, when the action needs a reason.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// `kind namespace/name`, as `kubectl` names objects.
    pub fn display_name(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("{} {namespace}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }

    fn is_secret(&self) -> bool {
        self.kind == "Secret" && self.api_version == "v1"
    }
}

/// Whether a field path of a Secret holds secret data.
fn is_secret_data(path: &str) -> bool {
    ["data", "stringData"].iter().any(|field| {
        path == *field
            || path
                .strip_prefix(field)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
    })
}

/// One field that would change: its value before and after. `None` before
/// means the field would be added; `None` after, removed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    before: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    after: Option<Value>,
}

impl FieldChange {
    /// `path` (`spec.replicas`, `metadata.labels["app.kubernetes.io/name"]`,
    /// `spec.containers[0].image`) going from `before` to `after`.
    pub fn new(path: impl Into<String>, before: Option<Value>, after: Option<Value>) -> Self {
        FieldChange {
            path: path.into(),
            before,
            after,
        }
    }

    /// The field's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The value now; `None` if the field is not set.
    pub fn before(&self) -> Option<&Value> {
        self.before.as_ref()
    }

    /// The value after; `None` if the field would be removed.
    pub fn after(&self) -> Option<&Value> {
        self.after.as_ref()
    }

    /// Replaces both values with [`MASKED`], keeping whether each is set.
    pub fn mask(&mut self) {
        for value in [&mut self.before, &mut self.after].into_iter().flatten() {
            *value = Value::String(MASKED.to_owned());
        }
    }
}

/// One line: `path: before -> after`. Two strings of several lines (a
/// config file in a ConfigMap) show only the lines that differ, with their
/// line number; two long one-line strings show the part around the first
/// difference. Either way the change is visible, not cut off.
impl fmt::Display for FieldChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(Value::String(before)), Some(Value::String(after))) =
            (&self.before, &self.after)
            && before != MASKED
            && after != MASKED
            && (before.contains('\n') || after.contains('\n'))
        {
            return write_lines(f, &self.path, before, after);
        }
        if let (Some(Value::String(before)), Some(Value::String(after))) =
            (&self.before, &self.after)
            && (before.chars().count() > SHORT || after.chars().count() > SHORT)
            && before != MASKED
            && after != MASKED
        {
            return write_window(f, &self.path, before, after);
        }
        let show = |value: &Option<Value>| match value {
            Some(Value::String(s)) if s == MASKED => s.clone(),
            Some(value) => short(value),
            None => "(none)".to_owned(),
        };
        write!(
            f,
            "{}: {} -> {}",
            self.path,
            show(&self.before),
            show(&self.after)
        )
    }
}

/// The longest value shown whole.
const SHORT: usize = 120;

/// The lines that differ between two texts: `path line 4: "a" -> "b"`.
fn write_lines(f: &mut fmt::Formatter<'_>, path: &str, before: &str, after: &str) -> fmt::Result {
    let b: Vec<&str> = before.split('\n').collect();
    let a: Vec<&str> = after.split('\n').collect();
    let prefix = b.iter().zip(&a).take_while(|(x, y)| x == y).count();
    let suffix = b[prefix..]
        .iter()
        .rev()
        .zip(a[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let removed = &b[prefix..b.len() - suffix];
    let added = &a[prefix..a.len() - suffix];
    let lines = |lines: &[&str]| -> String {
        if lines.is_empty() {
            return "(none)".to_owned();
        }
        let mut shown: Vec<String> = lines
            .iter()
            .take(3)
            .map(|line| short(&Value::String((*line).to_owned())))
            .collect();
        if lines.len() > 3 {
            shown.push(format!("(and {} more lines)", lines.len() - 3));
        }
        shown.join(" | ")
    };
    let first = prefix + 1;
    let span = removed.len().max(added.len());
    if span <= 1 {
        write!(f, "{path} line {first}: ")?;
    } else {
        write!(f, "{path} lines {first}-{}: ", prefix + span)?;
    }
    write!(f, "{} -> {}", lines(removed), lines(added))
}

/// Two long one-line strings: what is around the first difference.
fn write_window(f: &mut fmt::Formatter<'_>, path: &str, before: &str, after: &str) -> fmt::Result {
    let b: Vec<char> = before.chars().collect();
    let a: Vec<char> = after.chars().collect();
    let at = b.iter().zip(&a).take_while(|(x, y)| x == y).count();
    let start = at.saturating_sub(20);
    let window = |chars: &[char]| -> String {
        let end = (at + 40).min(chars.len());
        let text: String = chars[start.min(chars.len())..end].iter().collect();
        let head = if start > 0 { "..." } else { "" };
        let tail = if end < chars.len() { "..." } else { "" };
        format!(
            "{head}{}{tail}",
            serde_json::to_string(&text).unwrap_or_default()
        )
    };
    write!(
        f,
        "{path} at character {}: {} -> {}",
        at + 1,
        window(&b),
        window(&a)
    )
}

/// A value on one line, cut at 120 characters.
fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= SHORT {
        return text;
    }
    let cut: String = text.chars().take(SHORT - 3).collect();
    format!("{cut}...")
}

/// The fields that differ between two objects, `before` (live) and `after`
/// (what the server says it would become, e.g. a server-side apply
/// `dryRun=All` answer), in both directions: changed, added and removed.
///
/// What the server keeps for itself is left out: `status`, and in
/// `metadata` the `managedFields`, `resourceVersion`, `generation`, `uid`
/// and `creationTimestamp`.
///
/// ```
/// use provisioners_core::plan::diff;
/// use serde_json::json;
///
/// let live = json!({"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 1, "old": true}});
/// let after = json!({"metadata": {"resourceVersion": "2"}, "spec": {"replicas": 2}});
/// let changes: Vec<String> = diff(&live, &after).iter().map(ToString::to_string).collect();
/// assert_eq!(changes, ["spec.old: true -> (none)", "spec.replicas: 1 -> 2"]);
/// ```
pub fn diff(before: &Value, after: &Value) -> Vec<FieldChange> {
    let mut out = Vec::new();
    diff_at(String::new(), before, after, true, &mut out);
    out
}

fn diff_at(path: String, before: &Value, after: &Value, top: bool, out: &mut Vec<FieldChange>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                if top && key == "status" {
                    continue;
                }
                let child = join(&path, key);
                if path == "metadata" && SERVER_METADATA.contains(&key.as_str()) {
                    continue;
                }
                match (b.get(key), a.get(key)) {
                    (Some(b), Some(a)) => diff_at(child, b, a, false, out),
                    (Some(b), None) => out.push(FieldChange::new(child, Some(b.clone()), None)),
                    (None, Some(a)) => out.push(FieldChange::new(child, None, Some(a.clone()))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => {
            for (index, (b, a)) in b.iter().zip(a).enumerate() {
                diff_at(format!("{path}[{index}]"), b, a, false, out);
            }
        }
        (b, a) if b != a => out.push(FieldChange::new(path, Some(b.clone()), Some(a.clone()))),
        _ => {}
    }
}

/// The fields of `desired` (a manifest as a renderer wrote it, such as a
/// Helm chart's templates) that `live` does not hold, with the live value
/// before and the desired value after. Fields only `live` has are not
/// changes (the server and other managers set them); the comparison is
/// [`drift::contains_rendered`](crate::drift::contains_rendered)'s.
///
/// ```
/// use provisioners_core::plan::diff_rendered;
/// use serde_json::json;
///
/// let live = json!({"spec": {"replicas": 1, "paused": false}, "status": {}});
/// let desired = json!({"spec": {"replicas": 2}});
/// let changes = diff_rendered(&live, &desired);
/// assert_eq!(changes.len(), 1);
/// assert_eq!(changes[0].to_string(), "spec.replicas: 1 -> 2");
/// ```
pub fn diff_rendered(live: &Value, desired: &Value) -> Vec<FieldChange> {
    let mut out = Vec::new();
    rendered_at(String::new(), live, desired, &mut out);
    out
}

fn rendered_at(path: String, live: &Value, desired: &Value, out: &mut Vec<FieldChange>) {
    if crate::drift::contains_rendered(live, desired) {
        return;
    }
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => {
            let mut keys: Vec<&String> = d.keys().collect();
            keys.sort();
            for key in keys {
                let child = join(&path, key);
                match l.get(key) {
                    Some(l) => rendered_at(child, l, &d[key], out),
                    None if !is_empty_value(&d[key]) => {
                        out.push(FieldChange::new(child, None, Some(d[key].clone())));
                    }
                    None => {}
                }
            }
        }
        (Value::Array(l), Value::Array(d)) if l.len() == d.len() => {
            for (index, (l, d)) in l.iter().zip(d).enumerate() {
                rendered_at(format!("{path}[{index}]"), l, d, out);
            }
        }
        (l, d) => out.push(FieldChange::new(path, Some(l.clone()), Some(d.clone()))),
    }
}

fn is_empty_value(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// What the server keeps in `metadata` for itself.
const SERVER_METADATA: &[&str] = &[
    "managedFields",
    "resourceVersion",
    "generation",
    "uid",
    "creationTimestamp",
];

/// `path.key`, or `path["key"]` for a key that is not a plain word.
fn join(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (path.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{path}.{key}"),
        (_, false) => format!("{path}[{}]", serde_json::to_string(key).unwrap_or_default()),
    }
}

/// What would happen to a Helm release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReleaseAction {
    /// The release does not exist and would be installed.
    Install,
    /// The release would be upgraded: its chart, values or rendered objects
    /// changed.
    Upgrade,
    /// The release is deployed as asked, and its objects hold what the
    /// chart set.
    NoChange,
    /// The release is deployed as asked, but live objects lost what the
    /// chart set (someone edited them): provisioning would repair them.
    Drift,
    /// The release would be uninstalled.
    Uninstall,
    /// There is no release to uninstall.
    Absent,
}

impl ReleaseAction {
    /// The word for the action: `install`, `upgrade`, `no change`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseAction::Install => "install",
            ReleaseAction::Upgrade => "upgrade",
            ReleaseAction::NoChange => "no change",
            ReleaseAction::Drift => "drift",
            ReleaseAction::Uninstall => "uninstall",
            ReleaseAction::Absent => "absent",
        }
    }
}

impl fmt::Display for ReleaseAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What would happen to a Helm release: its name and namespace, the action,
/// and the chart and revision involved. The objects it would change are the
/// node's [`objects`](Plan::objects).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleasePlan {
    name: String,
    namespace: String,
    action: ReleaseAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chart: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revision: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl ReleasePlan {
    /// `action` on the release `namespace/name`.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        action: ReleaseAction,
    ) -> Self {
        ReleasePlan {
            name: name.into(),
            namespace: namespace.into(),
            action,
            chart: None,
            revision: None,
            reason: None,
        }
    }

    /// The chart the release would run (`name-version`).
    pub fn with_chart(mut self, chart: impl Into<String>) -> Self {
        self.chart = Some(chart.into());
        self
    }

    /// The revision deployed now.
    pub fn with_revision(mut self, revision: u64) -> Self {
        self.revision = Some(revision);
        self
    }

    /// Why the action (what changed: chart, values, objects).
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// The release's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The release's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// What would happen to it.
    pub fn action(&self) -> ReleaseAction {
        self.action
    }

    /// The chart, `name-version`.
    pub fn chart(&self) -> Option<&str> {
        self.chart.as_deref()
    }

    /// The revision deployed now.
    pub fn revision(&self) -> Option<u64> {
        self.revision
    }

    /// Why.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }
}

/// How many objects, releases and nodes of a plan would do what.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Counts {
    /// Objects to create.
    pub create: usize,
    /// Objects to update.
    pub update: usize,
    /// Objects that would not change.
    pub no_change: usize,
    /// Objects to delete.
    pub delete: usize,
    /// Objects to replace.
    pub replace: usize,
    /// Objects to adopt.
    pub adopt: usize,
    /// Objects provisioning would refuse to touch.
    pub refuse: usize,
    /// Objects whose fate is unknown.
    pub unknown: usize,
    /// Nodes whose plan is unknown.
    pub unknown_nodes: usize,
    /// Releases to install.
    pub install: usize,
    /// Releases to upgrade.
    pub upgrade: usize,
    /// Releases whose objects drifted.
    pub drift: usize,
    /// Releases to uninstall.
    pub uninstall: usize,
}

impl Counts {
    /// Whether anything would (or might) change.
    pub fn has_changes(&self) -> bool {
        self.create
            + self.update
            + self.delete
            + self.replace
            + self.adopt
            + self.refuse
            + self.unknown
            + self.unknown_nodes
            + self.install
            + self.upgrade
            + self.drift
            + self.uninstall
            > 0
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            (self.create, "to create"),
            (self.update, "to update"),
            (self.replace, "to replace"),
            (self.delete, "to delete"),
            (self.adopt, "to adopt"),
            (self.refuse, "refused"),
            (self.unknown, "unknown"),
            (self.no_change, "unchanged"),
        ];
        let mut words: Vec<String> = parts
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        let releases = [
            (self.install, "to install"),
            (self.upgrade, "to upgrade"),
            (self.drift, "drifted"),
            (self.uninstall, "to uninstall"),
        ];
        let releases: Vec<String> = releases
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        if !releases.is_empty() {
            words.push(format!("releases: {}", releases.join(", ")));
        }
        if self.unknown_nodes > 0 {
            let s = if self.unknown_nodes == 1 { "" } else { "s" };
            words.push(format!("{} node{s} unknown", self.unknown_nodes));
        }
        if words.is_empty() {
            return f.write_str("nothing to do");
        }
        f.write_str(&words.join(", "))
    }
}

/// Reads like `kubectl diff` or a terraform plan: one line per node with its
/// operation, one per object that would change (with its fields below it),
/// a count of the objects that would not, and a summary. The alternate form
/// (`{:#}`) lists unchanged objects too.
impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (path, node) in self.nodes() {
            let depth = path.matches('/').count();
            let indent = "  ".repeat(depth);
            write!(
                f,
                "{indent}{path}: {} {}",
                node.kind,
                node.operation.as_str()
            )?;
            if let Some(cluster) = &node.cluster {
                write!(f, " on cluster `{cluster}`")?;
            }
            if let Some(note) = &node.note {
                write!(f, " ({note})")?;
            }
            writeln!(f)?;
            if let Some(reason) = &node.unknown {
                writeln!(f, "{indent}  ? unknown: {reason}")?;
            }
            if let Some(release) = &node.release {
                write!(
                    f,
                    "{indent}  release {}/{}: {}",
                    release.namespace, release.name, release.action
                )?;
                if let Some(chart) = &release.chart {
                    write!(f, ", chart {chart}")?;
                }
                if let Some(revision) = release.revision {
                    write!(f, ", revision {revision} deployed")?;
                }
                if let Some(reason) = &release.reason {
                    write!(f, " ({reason})")?;
                }
                writeln!(f)?;
            }
            let mut unchanged = 0;
            for object in &node.objects {
                if object.action == Action::NoChange && !f.alternate() {
                    unchanged += 1;
                    continue;
                }
                write!(
                    f,
                    "{indent}  {} {} {}",
                    object.action.marker(),
                    object.api_version,
                    object.display_name()
                )?;
                match &object.reason {
                    Some(reason) => writeln!(f, " ({}: {reason})", object.action)?,
                    None => writeln!(f, " ({})", object.action)?,
                }
                for change in &object.changes {
                    writeln!(f, "{indent}      {change}")?;
                }
            }
            if unchanged > 0 {
                writeln!(f, "{indent}  = {unchanged} unchanged")?;
            }
        }
        write!(f, "Plan: {}", self.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Plan {
        Plan::new("platform", Operation::Provision, "serial")
            .with_child(
                Plan::new("metrics", Operation::Provision, "manifest")
                    .with_object(ObjectPlan::new(
                        "v1",
                        "Namespace",
                        None,
                        "monitoring",
                        Action::NoChange,
                    ))
                    .with_object(
                        ObjectPlan::new(
                            "v1",
                            "Secret",
                            Some("monitoring"),
                            "creds",
                            Action::Update,
                        )
                        .with_changes(vec![
                            FieldChange::new(
                                "data.password",
                                Some(json!("b2xk")),
                                Some(json!("bmV3")),
                            ),
                            FieldChange::new("stringData", None, Some(json!({"k": "v"}))),
                            FieldChange::new("metadata.labels.tier", None, Some(json!("db"))),
                        ]),
                    ),
            )
            .with_child(
                Plan::new("agent", Operation::Deprovision, "helm")
                    .with_note("condition is false")
                    .with_release(
                        ReleasePlan::new("agent", "ops", ReleaseAction::Uninstall).with_revision(3),
                    ),
            )
            .with_child(Plan::unknown("custom", Operation::Provision, "no plan"))
    }

    #[test]
    fn secret_data_is_masked_and_other_fields_are_not() {
        let plan = sample();
        let text = format!("{plan:#}");
        let json = serde_json::to_string(&plan).unwrap();
        for shown in [&text, &json] {
            assert!(
                !shown.contains("b2xk") && !shown.contains("bmV3"),
                "{shown}"
            );
            assert!(!shown.contains("\"v\""), "{shown}");
            assert!(shown.contains("db"), "{shown}");
        }
        assert!(
            text.contains("data.password: (sensitive value) -> (sensitive value)"),
            "{text}"
        );
        assert!(
            text.contains("stringData: (none) -> (sensitive value)"),
            "{text}"
        );
        // A kind that only looks like a Secret is not masked.
        let other = ObjectPlan::new("example.com/v1", "Secret", None, "x", Action::Update)
            .with_changes(vec![FieldChange::new("data.k", None, Some(json!("v")))]);
        assert_eq!(other.changes()[0].after(), Some(&json!("v")));
        // Only `data`/`stringData` and what is below them.
        assert!(
            is_secret_data("data") && is_secret_data("data.k") && is_secret_data("data[\"a.b\"]")
        );
        assert!(!is_secret_data("dataset") && !is_secret_data("metadata.data"));
    }

    #[test]
    fn the_digest_is_stable_and_changes_with_the_plan() {
        let plan = sample();
        let digest = plan.digest();
        assert_eq!(digest.len(), 7 + 64);
        assert_eq!(digest, sample().digest());
        // A JSON round trip (another process reading the status) keeps it.
        let back: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
        assert_eq!(back, plan);
        assert_eq!(back.digest(), digest);
        let changed = sample().with_child(Plan::new("more", Operation::Provision, "manifest"));
        assert_ne!(changed.digest(), digest);
        // Key order in values does not matter.
        let a = ObjectPlan::new("v1", "ConfigMap", None, "x", Action::Update).with_changes(vec![
            FieldChange::new("data", None, Some(json!({"a": 1, "b": 2}))),
        ]);
        let mut map = serde_json::Map::new();
        map.insert("b".into(), json!(2));
        map.insert("a".into(), json!(1));
        let b = ObjectPlan::new("v1", "ConfigMap", None, "x", Action::Update).with_changes(vec![
            FieldChange::new("data", None, Some(Value::Object(map))),
        ]);
        let node = |o| Plan::new("n", Operation::Provision, "manifest").with_object(o);
        assert_eq!(node(a).digest(), node(b).digest());
    }

    #[test]
    fn display_reads_like_a_diff() {
        let text = sample().to_string();
        let expected = "\
platform: serial provision
  platform/metrics: manifest provision
    ~ v1 Secret monitoring/creds (update)
        data.password: (sensitive value) -> (sensitive value)
        stringData: (none) -> (sensitive value)
        metadata.labels.tier: (none) -> \"db\"
    = 1 unchanged
  platform/agent: helm deprovision (condition is false)
    release ops/agent: uninstall, revision 3 deployed
  platform/custom: unknown provision
    ? unknown: no plan
Plan: 1 to update, 1 unchanged, releases: 1 to uninstall, 1 node unknown";
        assert_eq!(text, expected);
        assert!(format!("{:#}", sample()).contains("= v1 Namespace monitoring (no change)"));
        assert_eq!(
            Plan::new("x", Operation::Provision, "serial").summary(),
            "nothing to do"
        );
    }

    #[test]
    fn counts_and_lookups_cover_the_tree() {
        let plan = sample();
        let counts = plan.counts();
        assert_eq!(
            (
                counts.update,
                counts.no_change,
                counts.uninstall,
                counts.unknown_nodes
            ),
            (1, 1, 1, 1)
        );
        assert!(plan.has_changes());
        assert_eq!(plan.find("platform/agent").unwrap().kind(), "helm");
        assert!(plan.find("platform/nope").is_none());
        assert_eq!(plan.all_objects().len(), 2);
        assert_eq!(plan.all_objects()[0].0, "platform/metrics");
        let quiet = Plan::new("x", Operation::Provision, "manifest").with_object(ObjectPlan::new(
            "v1",
            "ConfigMap",
            None,
            "c",
            Action::NoChange,
        ));
        assert!(!quiet.has_changes());
    }

    #[test]
    fn diffs_name_fields_as_kubectl_does() {
        let live = json!({
            "metadata": {"labels": {"app.kubernetes.io/name": "a"}, "uid": "1", "managedFields": []},
            "spec": {"containers": [{"image": "a:1", "name": "c"}], "gone": 1},
            "status": {"phase": "Running"},
        });
        let after = json!({
            "metadata": {"labels": {"app.kubernetes.io/name": "b"}, "uid": "1"},
            "spec": {"containers": [{"image": "a:2", "name": "c"}], "added": [1]},
            "status": {"phase": "Pending"},
        });
        let changes: Vec<String> = diff(&live, &after)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            changes,
            [
                "metadata.labels[\"app.kubernetes.io/name\"]: \"a\" -> \"b\"",
                "spec.added: (none) -> [1]",
                "spec.containers[0].image: \"a:1\" -> \"a:2\"",
                "spec.gone: 1 -> (none)",
            ]
        );
        assert!(diff(&live, &live).is_empty());
        // Lists of another length change as a whole.
        let changes = diff(&json!({"a": [1]}), &json!({"a": [1, 2]}));
        assert_eq!(changes[0].to_string(), "a: [1] -> [1,2]");
        // Rendered: tolerant of what the server adds and of number forms.
        let live = json!({"spec": {"cpu": "1", "extra": true, "list": [{"a": 1, "b": 2}]}});
        assert!(
            diff_rendered(
                &live,
                &json!({"spec": {"cpu": 1, "empty": {}, "list": [{"a": 1}]}})
            )
            .is_empty()
        );
        let changes = diff_rendered(&live, &json!({"spec": {"list": [{"a": 3}], "new": "x"}}));
        let changes: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            changes,
            ["spec.list[0].a: 1 -> 3", "spec.new: (none) -> \"x\""]
        );
    }

    #[test]
    fn long_values_are_cut_but_their_change_stays_visible() {
        let change = FieldChange::new("data.big", None, Some(json!("x".repeat(500))));
        assert!(change.to_string().len() < 200);

        // A config file: only the line that changed, with its number.
        let before =
            "modules:\n  icmp:\n    prober: icmp\n    preferred_ip_protocol: ip4\n  tcp: {}\n";
        let after = before.replace("ip4", "ip6");
        let change = FieldChange::new(
            "data[\"config.yml\"]",
            Some(json!(before)),
            Some(json!(after)),
        );
        assert_eq!(
            change.to_string(),
            "data[\"config.yml\"] line 4: \"    preferred_ip_protocol: ip4\" -> \"    preferred_ip_protocol: ip6\""
        );
        let added = format!("{before}extra: 1\nmore: 2\n");
        let change = FieldChange::new("data.c", Some(json!(before)), Some(json!(added)));
        assert_eq!(
            change.to_string(),
            "data.c lines 6-7: (none) -> \"extra: 1\" | \"more: 2\""
        );

        // A long line: the part around the first difference.
        let long = format!("{}A{}", "x".repeat(300), "y".repeat(300));
        let changed = long.replace('A', "B");
        let text =
            FieldChange::new("spec.arg", Some(json!(long)), Some(json!(changed))).to_string();
        assert!(text.starts_with("spec.arg at character 301: "), "{text}");
        assert!(
            text.contains("xA") && text.contains("xB") && text.len() < 200,
            "{text}"
        );

        // Masked values stay masked whatever their shape.
        let mut secret = FieldChange::new("data.key", Some(json!("a\nb")), Some(json!("a\nc")));
        secret.mask();
        assert_eq!(
            secret.to_string(),
            "data.key: (sensitive value) -> (sensitive value)"
        );
    }
}
