//! Object plans in a plan tree: the [`PlanObjects`] extension of core's
//! [`Plan`] and the tree's [`ObjectCounts`].

use provisioners_core::plan::Plan;

use super::object::{Change, ObjectPlan};

/// Object plans on a core [`Plan`], as details of kind
/// [`"object"`](super::DETAIL_KIND): the way a leaf adds them and a reader
/// finds them again (as `provisioners-helm`'s `PlanRelease` does for a
/// release, or tower's `ServiceExt` for a service).
///
/// ```
/// use provisioners_core::{plan::Plan, Operation};
/// use provisioners_kit::plan::{Change, ObjectPlan, PlanObjects};
///
/// let plan = Plan::new("apps", Operation::Provision, "serial").with(
///     Plan::new("web", Operation::Provision, "manifest")
///         .with_object(ObjectPlan::new("v1", "ConfigMap", Some("apps"), "web", Change::Create)),
/// );
/// let objects = plan.all_objects();
/// assert_eq!(objects[0].0, "apps/web");
/// assert_eq!(objects[0].1.name(), "web");
/// assert_eq!(plan.object_counts().create, 1);
/// ```
pub trait PlanObjects {
    /// Adds one object plan, after the details already there.
    fn with_object(self, object: ObjectPlan) -> Plan;

    /// Adds object plans, in order.
    fn with_objects(self, objects: impl IntoIterator<Item = ObjectPlan>) -> Plan;

    /// This node's object plans, in the order they were added (the order
    /// they would be applied).
    fn objects(&self) -> Vec<ObjectPlan>;

    /// Every object plan of the tree, with the path of its node, depth
    /// first.
    fn all_objects(&self) -> Vec<(String, ObjectPlan)>;

    /// How many objects of the tree would do what.
    fn object_counts(&self) -> ObjectCounts;
}

impl PlanObjects for Plan {
    fn with_object(self, object: ObjectPlan) -> Plan {
        self.with_detail(object.to_detail())
    }

    fn with_objects(self, objects: impl IntoIterator<Item = ObjectPlan>) -> Plan {
        self.with_details(objects.into_iter().map(|object| object.to_detail()))
    }

    fn objects(&self) -> Vec<ObjectPlan> {
        self.details()
            .iter()
            .filter_map(ObjectPlan::from_detail)
            .collect()
    }

    fn all_objects(&self) -> Vec<(String, ObjectPlan)> {
        self.nodes()
            .into_iter()
            .flat_map(|(path, node)| {
                node.objects()
                    .into_iter()
                    .map(move |object| (path.clone(), object))
            })
            .collect()
    }

    fn object_counts(&self) -> ObjectCounts {
        let mut counts = ObjectCounts::default();
        for (_, object) in self.all_objects() {
            counts.add(object.action());
        }
        counts
    }
}

/// How many objects of a plan tree would do what.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectCounts {
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
}

impl ObjectCounts {
    fn add(&mut self, action: Change) {
        let count = match action {
            Change::Create => &mut self.create,
            Change::Update => &mut self.update,
            Change::NoChange => &mut self.no_change,
            Change::Delete => &mut self.delete,
            Change::Replace => &mut self.replace,
            Change::Adopt => &mut self.adopt,
            Change::Refuse => &mut self.refuse,
            Change::Unknown => &mut self.unknown,
        };
        *count += 1;
    }
}
