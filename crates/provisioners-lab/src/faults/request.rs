//! What a Kubernetes API request is about, read from its method and URL the
//! way kube-apiserver's `RequestInfoFactory` reads it.

use std::fmt;

/// The Kubernetes verb of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Verb {
    /// `GET` of one named object.
    Get,
    /// `GET` of a collection.
    List,
    /// `GET` of a collection with `watch=true`.
    Watch,
    /// `POST`.
    Create,
    /// `PUT`.
    Update,
    /// `PATCH` (server-side apply included).
    Patch,
    /// `DELETE` of one named object.
    Delete,
    /// `DELETE` of a collection.
    DeleteCollection,
    /// Anything else: `HEAD`, `OPTIONS`, ...
    Other,
}

impl Verb {
    /// `POST`, `PUT`, `PATCH` and `DELETE`: the verbs that change state.
    pub fn is_mutating(self) -> bool {
        matches!(
            self,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
        )
    }

    /// The verb as kube-apiserver names it in audit logs and RBAC.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Other => "other",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request through the proxy: its verb and the resource it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestInfo {
    /// The verb.
    pub verb: Verb,
    /// Whether the URL names a resource (`/api/...`, `/apis/<group>/<version>/...`
    /// with a resource), as opposed to discovery, `/version`, `/openapi`, health.
    pub is_resource: bool,
    /// API group; empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Resource (plural), e.g. `configmaps`.
    pub resource: String,
    /// Subresource, e.g. `status`.
    pub subresource: String,
    /// Namespace, when the URL has one.
    pub namespace: Option<String>,
    /// Object name, when the URL has one.
    pub name: Option<String>,
    /// `dryRun=All`: a mutating verb that changes nothing.
    pub dry_run: bool,
    /// The request path, without the query.
    pub path: String,
}

impl RequestInfo {
    /// Reads `method` and `path_and_query` as kube-apiserver does.
    pub fn parse(method: &http::Method, path_and_query: &str) -> Self {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let query_flag = |key: &str| {
            query.split('&').find_map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (k == key).then(|| v.to_owned())
            })
        };
        let watch = query_flag("watch").is_some_and(|v| v == "true" || v == "1");
        let dry_run = query_flag("dryRun").is_some_and(|v| v == "All");

        let mut info = RequestInfo {
            verb: Verb::Other,
            is_resource: false,
            group: String::new(),
            version: String::new(),
            resource: String::new(),
            subresource: String::new(),
            namespace: None,
            name: None,
            dry_run,
            path: path.to_owned(),
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let rest: &[&str] = match parts.as_slice() {
            ["api", version, rest @ ..] if !rest.is_empty() => {
                info.version = (*version).to_owned();
                rest
            }
            ["apis", group, version, rest @ ..] if !rest.is_empty() => {
                info.group = (*group).to_owned();
                info.version = (*version).to_owned();
                rest
            }
            _ => {
                info.verb = match *method {
                    http::Method::GET => Verb::Get,
                    _ => Verb::Other,
                };
                return info;
            }
        };
        info.is_resource = true;
        let mut rest = rest;
        // `namespaces/<ns>/<resource>...`, unless what follows is a
        // subresource of the namespace itself (status, finalize).
        if rest[0] == "namespaces" && rest.len() > 1 {
            info.namespace = Some(rest[1].to_owned());
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        info.resource = rest[0].to_owned();
        info.name = rest.get(1).map(|s| (*s).to_owned());
        info.subresource = rest.get(2).map(|s| (*s).to_owned()).unwrap_or_default();
        if info.resource == "namespaces" {
            // The namespace's own URL: its name is the namespace.
            info.name.clone_from(&info.namespace);
            if rest.len() == 1 {
                info.name = None;
            }
        }
        info.verb = match *method {
            http::Method::GET if watch => Verb::Watch,
            http::Method::GET if info.name.is_none() => Verb::List,
            http::Method::GET => Verb::Get,
            http::Method::POST => Verb::Create,
            http::Method::PUT => Verb::Update,
            http::Method::PATCH => Verb::Patch,
            http::Method::DELETE if info.name.is_none() => Verb::DeleteCollection,
            http::Method::DELETE => Verb::Delete,
            _ => Verb::Other,
        };
        info
    }

    /// A mutating verb that is not a dry run: a request that may change
    /// what the cluster stores. This is what the crash-point driver counts.
    pub fn is_write(&self) -> bool {
        self.verb.is_mutating() && !self.dry_run && self.is_resource && !is_review(&self.resource)
    }

    /// `resource` with its group, as in RBAC: `deployments.apps`, `configmaps`.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

/// Reviews are POSTs that ask a question and store nothing.
fn is_review(resource: &str) -> bool {
    matches!(
        resource,
        "selfsubjectaccessreviews"
            | "subjectaccessreviews"
            | "localsubjectaccessreviews"
            | "selfsubjectrulesreviews"
            | "selfsubjectreviews"
            | "tokenreviews"
    )
}

impl fmt::Display for RequestInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.is_resource {
            return write!(f, "{} {}", self.verb, self.path);
        }
        write!(f, "{} {}", self.verb, self.group_resource())?;
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) if self.resource != "namespaces" => write!(f, " {ns}/{name}"),
            (_, Some(name)) => write!(f, " {name}"),
            (Some(ns), None) => write!(f, " in {ns}"),
            (None, None) => Ok(()),
        }?;
        if self.dry_run {
            f.write_str(" (dry run)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;

    fn parse(method: &Method, url: &str) -> RequestInfo {
        RequestInfo::parse(method, url)
    }

    #[test]
    fn namespaced_objects_collections_and_subresources() {
        let r = parse(
            &Method::PATCH,
            "/apis/apps/v1/namespaces/ns1/deployments/web/status?fieldManager=x",
        );
        assert_eq!(r.verb, Verb::Patch);
        assert_eq!(
            (r.group.as_str(), r.version.as_str(), r.resource.as_str()),
            ("apps", "v1", "deployments")
        );
        assert_eq!(r.namespace.as_deref(), Some("ns1"));
        assert_eq!(r.name.as_deref(), Some("web"));
        assert_eq!(r.subresource, "status");
        assert!(r.is_write());
        assert_eq!(r.to_string(), "patch deployments.apps/status ns1/web");

        let r = parse(&Method::GET, "/api/v1/namespaces/ns1/configmaps");
        assert_eq!((r.verb, r.resource.as_str()), (Verb::List, "configmaps"));
        let r = parse(
            &Method::GET,
            "/api/v1/namespaces/ns1/configmaps?watch=true&resourceVersion=1",
        );
        assert_eq!(r.verb, Verb::Watch);
        let r = parse(&Method::DELETE, "/api/v1/namespaces/ns1/pods");
        assert_eq!(r.verb, Verb::DeleteCollection);
        let r = parse(&Method::POST, "/api/v1/namespaces/ns1/secrets");
        assert_eq!((r.verb, r.name), (Verb::Create, None));
    }

    #[test]
    fn namespaces_themselves() {
        let r = parse(&Method::DELETE, "/api/v1/namespaces/team-a");
        assert_eq!((r.verb, r.resource.as_str()), (Verb::Delete, "namespaces"));
        assert_eq!(r.name.as_deref(), Some("team-a"));
        let r = parse(&Method::PUT, "/api/v1/namespaces/team-a/finalize");
        assert_eq!(
            (r.resource.as_str(), r.subresource.as_str()),
            ("namespaces", "finalize")
        );
        assert_eq!(r.name.as_deref(), Some("team-a"));
        let r = parse(&Method::POST, "/api/v1/namespaces");
        assert_eq!((r.verb, r.name), (Verb::Create, None));
        let r = parse(&Method::GET, "/api/v1/namespaces");
        assert_eq!(r.verb, Verb::List);
    }

    #[test]
    fn cluster_scoped_discovery_dry_runs_and_reviews() {
        let r = parse(
            &Method::PATCH,
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/a.example.com?dryRun=All",
        );
        assert!(r.dry_run && !r.is_write());
        assert_eq!(r.namespace, None);
        for url in ["/api", "/apis", "/apis/apps/v1", "/version", "/openapi/v2"] {
            let r = parse(&Method::GET, url);
            assert!(!r.is_resource, "{url}");
            assert_eq!(r.verb, Verb::Get);
        }
        let r = parse(
            &Method::POST,
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        );
        assert!(r.verb.is_mutating() && !r.is_write());
    }
}
