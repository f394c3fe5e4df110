//! Kubeconfigs (YAML) within serde-saphyr's budget.

use kube::config::Kubeconfig;

use super::Refused;

/// The most text a kubeconfig may have: a Secret holds at most 1 MiB.
pub const KUBECONFIG_BYTES: usize = 1 << 20;

/// serde-saphyr's budget for one kubeconfig: a real one is a handful of
/// clusters, users and contexts (a few hundred nodes, certificates of a
/// few KiB as scalars), with no use for aliases or many documents.
pub fn kubeconfig_budget() -> serde_saphyr::Budget {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_reader_input_bytes = Some(KUBECONFIG_BYTES);
    budget.max_events = 40_000;
    budget.max_nodes = 16_384;
    budget.max_depth = 16;
    budget.max_documents = 16;
    budget.max_aliases = 64;
    budget.max_anchors = 64;
    budget.max_merge_keys = 64;
    budget.max_recorded_anchor_events = 4_096;
    budget.max_recorded_anchor_bytes = KUBECONFIG_BYTES;
    budget.max_total_scalar_bytes = KUBECONFIG_BYTES;
    budget
}

/// `Kubeconfig::from_yaml` within [`kubeconfig_budget`]: every document of
/// `text` parsed and merged as kube does, with the input capped at
/// [`KUBECONFIG_BYTES`] and the parse stopped as soon as a limit is crossed.
///
/// The error never quotes the input (a kubeconfig holds credentials): it
/// names the limit crossed, or where the YAML is not a kubeconfig.
///
/// ```
/// use provisioners_client::bounded::kubeconfig_from_yaml;
///
/// let config = kubeconfig_from_yaml(
///     "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster:\n    server: https://a:6443\n",
/// )?;
/// assert_eq!(config.clusters[0].name, "a");
///
/// // An extension is any value: 100 levels of it are over the budget.
/// let deep = format!(
///     "extensions:\n- name: x\n  extension: {}{}\n",
///     "[".repeat(100),
///     "]".repeat(100)
/// );
/// let refused = kubeconfig_from_yaml(&deep).unwrap_err();
/// assert_eq!(refused.to_string(), "nested more than 16 levels deep");
/// # Ok::<(), provisioners_client::bounded::Refused>(())
/// ```
///
/// # Errors
///
/// [`Refused`]: a limit crossed, not YAML, or not a kubeconfig.
pub fn kubeconfig_from_yaml(text: &str) -> Result<Kubeconfig, Refused> {
    if text.len() > KUBECONFIG_BYTES {
        return Err(Refused::Text {
            limit: KUBECONFIG_BYTES as u64,
        });
    }
    let budget = kubeconfig_budget();
    let limits = budget.clone();
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    let documents: Vec<Kubeconfig> = serde_saphyr::from_multiple_with_options(text, options)
        .map_err(|e| refused(&e, &limits))?;
    documents
        .into_iter()
        .try_fold(Kubeconfig::default(), Kubeconfig::merge)
        .map_err(|e| Refused::Shape(e.to_string()))
}

/// The limit `error` crossed, or where the text is not a kubeconfig (a
/// line, never the text).
fn refused(error: &serde_saphyr::Error, limits: &serde_saphyr::Budget) -> Refused {
    use serde_saphyr::budget::BudgetBreach;
    let wide = |n: usize| n as u64;
    let mut error = error;
    while let serde_saphyr::Error::WithSnippet { error: inner, .. }
    | serde_saphyr::Error::AliasError { error: inner, .. } = error
    {
        error = inner;
    }
    match error {
        serde_saphyr::Error::Budget { breach, .. } => match breach {
            BudgetBreach::Depth { .. } => Refused::Depth {
                limit: u32::try_from(limits.max_depth).unwrap_or(u32::MAX),
            },
            BudgetBreach::Nodes { .. } => Refused::Nodes {
                limit: wide(limits.max_nodes),
            },
            BudgetBreach::ScalarBytes { .. } => Refused::Text {
                limit: wide(limits.max_total_scalar_bytes),
            },
            other => Refused::Yaml(format!("{other:?}")),
        },
        other => {
            let line = other.location().map_or(0, |l| l.line());
            Refused::Syntax(format!("not a kubeconfig (line {line})"))
        }
    }
}
