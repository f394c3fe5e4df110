//! The RBAC table of docs/rbac.md and the example's deploy/operator.yaml
//! grant exactly the same rights: each rule is expanded to single
//! (scope, group, resource, names, verb) grants and the two sets compared,
//! so a right added to one and not the other is named.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// Where the table is checked from: the line after which it starts.
pub(super) const TABLE_MARKER: &str = "<!-- tidy: checked against operator.yaml -->";
const DOC: &str = "docs/rbac.md";
const OPERATOR_YAML: &str = "examples/platform-operator/deploy/operator.yaml";

/// One right: where, which group, which resource, which names, which verb.
type Grant = (String, String, String, String, String);

/// Every difference between the table and `operator.yaml` below `root`.
pub(super) fn problems(root: &Path) -> Vec<String> {
    let (Ok(doc), Ok(yaml)) = (
        fs::read_to_string(root.join(DOC)),
        fs::read_to_string(root.join(OPERATOR_YAML)),
    ) else {
        return vec![format!(
            "{DOC} and {OPERATOR_YAML} must both exist (the RBAC table is checked against the file)"
        )];
    };
    let table = match table_grants(&doc) {
        Ok(grants) => grants,
        Err(problem) => return vec![format!("{DOC}: {problem}")],
    };
    let granted = match yaml_grants(&yaml) {
        Ok(grants) => grants,
        Err(problem) => return vec![format!("{OPERATOR_YAML}: {problem}")],
    };
    let show = |(scope, group, resource, names, verb): &Grant| {
        let group = if group.is_empty() { "core" } else { group };
        let names = if names.is_empty() {
            String::new()
        } else {
            format!(" named {names}")
        };
        format!("{verb} {resource}{names} ({group}) in {scope}")
    };
    let mut problems: Vec<String> = granted
        .difference(&table)
        .map(|g| {
            format!(
                "{OPERATOR_YAML} grants {}, which the table in {DOC} does not list",
                show(g)
            )
        })
        .collect();
    problems.extend(table.difference(&granted).map(|g| {
        format!(
            "the table in {DOC} lists {}, which {OPERATOR_YAML} does not grant",
            show(g)
        )
    }));
    problems
}

/// A flow sequence's items: `["a", "b"]` is `a`, `b`; `[""]` is the empty
/// string (the core API group).
fn items(text: &str) -> Vec<String> {
    text.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| item.trim_matches('"').to_owned())
        .collect()
}

/// The grants of every Role and ClusterRole in a multi-document YAML text
/// written in the shape of operator.yaml (rules with flow sequences).
fn yaml_grants(yaml: &str) -> Result<BTreeSet<Grant>, String> {
    let mut grants = BTreeSet::new();
    for document in yaml.split("\n---") {
        let lines: Vec<&str> = document.lines().collect();
        let kind = lines.iter().find_map(|l| l.strip_prefix("kind: "));
        let scope = match kind {
            Some("ClusterRole") => "cluster".to_owned(),
            Some("Role") => lines
                .iter()
                .find_map(|l| l.strip_prefix("  namespace: "))
                .ok_or("a Role without metadata.namespace")?
                .trim()
                .to_owned(),
            _ => continue,
        };
        let mut rule: Option<[Vec<String>; 4]> = None;
        let mut flush = |rule: &mut Option<[Vec<String>; 4]>| -> Result<(), String> {
            let Some([groups, resources, names, verbs]) = rule.take() else {
                return Ok(());
            };
            if resources.is_empty() || verbs.is_empty() {
                return Err(format!("a rule of {scope} without resources or verbs"));
            }
            let names = names.join(",");
            for group in &groups {
                for resource in &resources {
                    for verb in &verbs {
                        grants.insert((
                            scope.clone(),
                            group.clone(),
                            resource.clone(),
                            names.clone(),
                            verb.clone(),
                        ));
                    }
                }
            }
            Ok(())
        };
        for line in lines {
            let line = line.trim();
            if let Some(groups) = line.strip_prefix("- apiGroups:") {
                flush(&mut rule)?;
                rule = Some([items(groups), Vec::new(), Vec::new(), Vec::new()]);
            } else if let Some(rule) = rule.as_mut() {
                for (index, key) in ["resources:", "resourceNames:", "verbs:"]
                    .iter()
                    .enumerate()
                {
                    if let Some(value) = line.strip_prefix(key) {
                        rule[index + 1] = items(value);
                    }
                }
            }
        }
        flush(&mut rule)?;
    }
    if grants.is_empty() {
        return Err("no Role or ClusterRole rules found".to_owned());
    }
    Ok(grants)
}

/// The grants of the table after [`TABLE_MARKER`]: columns `needed by`,
/// `scope`, `API group` (`core` for the core group), `resources`, `names`,
/// `verbs`, then anything; lists are comma-separated, backticks ignored.
fn table_grants(doc: &str) -> Result<BTreeSet<Grant>, String> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != TABLE_MARKER);
    if lines.next().is_none() {
        return Err(format!("no `{TABLE_MARKER}` line before the RBAC table"));
    }
    let rows: Vec<&str> = lines
        .skip_while(|l| !l.trim_start().starts_with('|'))
        .take_while(|l| l.trim_start().starts_with('|'))
        .skip(2) // the header and its separator
        .collect();
    let mut grants = BTreeSet::new();
    for row in rows {
        let cells: Vec<String> = row
            .trim()
            .trim_matches('|')
            .split('|')
            .map(|cell| cell.replace('`', "").trim().to_owned())
            .collect();
        let [_, scope, group, resources, names, verbs, ..] = cells.as_slice() else {
            return Err(format!("a row with fewer than six columns: {row}"));
        };
        let list = |cell: &str| -> Vec<String> {
            cell.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let group = if group == "core" { "" } else { group.as_str() };
        let names = list(names).join(",");
        for resource in list(resources) {
            for verb in list(verbs) {
                grants.insert((
                    scope.clone(),
                    group.to_owned(),
                    resource.clone(),
                    names.clone(),
                    verb,
                ));
            }
        }
    }
    if grants.is_empty() {
        return Err("the RBAC table after the marker has no rows".to_owned());
    }
    Ok(grants)
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"apiVersion: v1
kind: Namespace
metadata:
  name: op
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: op
rules:
  # comment
  - apiGroups: [""]
    resources: ["configmaps", "secrets"]
    verbs: ["get", "create"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: ["provisioners-helm.metrics"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: op-leader
  namespace: op
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["update"]
"#;

    fn doc(rows: &str) -> String {
        format!(
            "# RBAC\n\n{TABLE_MARKER}\n\n| needed by | scope | API group | resources | names | verbs | why |\n\
             |---|---|---|---|---|---|---|\n{rows}\nAfter the table.\n| not | a | row | of | it | x | y |\n"
        )
    }

    #[test]
    fn both_sides_expand_to_single_grants() {
        let yaml = yaml_grants(YAML).expect("grants");
        assert_eq!(yaml.len(), 6, "{yaml:#?}");
        let table = table_grants(&doc(
            "| manifest | cluster | core | `configmaps`, `secrets` | | get, create | apply |\n\
             | helm | cluster | `coordination.k8s.io` | leases | `provisioners-helm.metrics` | get | lock |\n\
             | runtime | `op` | coordination.k8s.io | leases | | update | leader |",
        ))
        .expect("grants");
        assert_eq!(yaml, table);
    }

    #[test]
    fn a_difference_either_way_is_named() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-rbac-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let yaml = root.join(OPERATOR_YAML);
        fs::create_dir_all(yaml.parent().expect("parent")).expect("mkdir");
        fs::create_dir_all(root.join("docs")).expect("mkdir");
        fs::write(&yaml, YAML).expect("write");
        fs::write(
            root.join(DOC),
            doc(
                "| manifest | cluster | core | configmaps, secrets | | get, create, delete | x |\n\
                 | runtime | op | coordination.k8s.io | leases | | update | leader |",
            ),
        )
        .expect("write");
        let found = problems(&root);
        assert_eq!(
            found,
            [
                format!(
                    "{OPERATOR_YAML} grants get leases named provisioners-helm.metrics \
                     (coordination.k8s.io) in cluster, which the table in {DOC} does not list"
                ),
                format!(
                    "the table in {DOC} lists delete configmaps (core) in cluster, which \
                     {OPERATOR_YAML} does not grant"
                ),
                format!(
                    "the table in {DOC} lists delete secrets (core) in cluster, which \
                     {OPERATOR_YAML} does not grant"
                ),
            ]
        );
        fs::write(root.join(DOC), "# RBAC without the marker\n").expect("write");
        assert!(
            problems(&root)[0].contains("no `<!-- tidy"),
            "{:?}",
            problems(&root)
        );
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
