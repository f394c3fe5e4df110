//! A fleet's [`Plan`]: which members would change, in which wave, each
//! member's own plan below it, bounded.

use std::time::SystemTime;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use provisioners_core::{Context, Operation, Plan, Provisioner, Result};

use crate::fleet::Fleet;
use crate::record::{MemberState, Record};
use crate::schedule::{self, Status};

/// Members planned in detail; the others are counted in the fleet's note.
pub const PLAN_DETAIL: usize = 20;

/// The plan of `fleet` for `operation`. Reads the state, writes nothing.
pub(crate) async fn plan(fleet: &Fleet, cx: &Context, operation: Operation) -> Result<Plan> {
    let cx = &fleet.acting(cx);
    let state = fleet.state_map(cx)?;
    let (members, waves) = fleet.arranged(cx).await?;
    let settings = fleet.settings(members.len());
    let stored = state.load(cx).await?;
    let records: Vec<Option<Record>> = members
        .iter()
        .map(|m| stored.records.get(m.name()).cloned().flatten())
        .collect();
    let now = SystemTime::now();
    // Positions that would change, in the order they would run.
    let mut changing: Vec<usize> = match operation {
        Operation::Provision => (0..members.len())
            .filter(|&p| !members[p].is_leaving())
            .filter(|&p| {
                let status = schedule::status(records[p].as_ref(), &fleet.revision, &settings, now);
                !matches!(status, Status::Done)
            })
            .collect(),
        Operation::Deprovision => (0..members.len())
            .filter(|&p| {
                !records[p]
                    .as_ref()
                    .is_some_and(|r| matches!(r.state, MemberState::Gone | MemberState::Abandoned))
            })
            .collect(),
    };
    if operation == Operation::Deprovision {
        changing.sort_by_key(|&p| std::cmp::Reverse(waves[p]));
    }
    let unchanged = members.len() - changing.len();
    let detailed: Vec<usize> = changing.iter().copied().take(PLAN_DETAIL).collect();
    let mut running = FuturesUnordered::new();
    for (order, &p) in detailed.iter().enumerate() {
        let member = &members[p];
        let wave = format!("wave {}", waves[p] + 1);
        running.push(async move {
            let plan = match member.problem() {
                Some(problem) => Plan::unknown(member.name(), operation, problem),
                None => {
                    let node = fleet.node(member);
                    match cx.plan_operation(&node, operation).await {
                        Ok(plan) => plan,
                        // One member that cannot plan (a dead cluster) does not hide the rest.
                        Err(error) => Plan::unknown(member.name(), operation, error.to_string()),
                    }
                }
            };
            (order, plan.with_note(wave))
        });
    }
    let mut plans = Vec::with_capacity(detailed.len());
    while let Some(done) = running.next().await {
        plans.push(done);
    }
    plans.sort_by_key(|(order, _)| *order);
    let waves_touched = {
        let mut touched: Vec<usize> = changing.iter().map(|&p| waves[p] + 1).collect();
        touched.sort_unstable();
        touched.dedup();
        touched
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut note = format!(
        "revision {}: {} of {} members change (waves {}), {unchanged} unchanged",
        fleet.revision,
        changing.len(),
        members.len(),
        if waves_touched.is_empty() {
            "none".to_owned()
        } else {
            waves_touched
        },
    );
    if changing.len() > detailed.len() {
        note.push_str(&format!(
            "; {} more members change, not planned in detail (the first {PLAN_DETAIL} are)",
            changing.len() - detailed.len()
        ));
    }
    let mut node = Plan::new(fleet.name(), operation, "fleet").with_note(note);
    node.extend(plans.into_iter().map(|(_, plan)| plan));
    Ok(node)
}
