//! [`RemoteCluster`]: a cluster other than the one the tree started on.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use kube::config::Kubeconfig;

use crate::{Cluster, Error, ErrorKind, Result};

/// A cluster reached through a kubeconfig obtained at run time, e.g. from a
/// Secret written by whatever created the cluster.
///
/// `provisioners-remote` turns one into a [`Cluster`] and runs a subtree
/// against it. Only [`id`](RemoteCluster::id) and
/// [`config`](RemoteCluster::config) are required; a remote whose
/// kubeconfig lives in a Secret also says which
/// ([`secret`](RemoteCluster::secret)), so that the remote node can protect
/// the Secret while the subtree exists, and may tell a kubeconfig that is
/// not there yet from one that fails
/// ([`read_config`](RemoteCluster::read_config)).
///
/// ```
/// use provisioners_core::{async_trait, RemoteCluster, Result};
/// use kube::config::Kubeconfig;
///
/// /// A remote whose kubeconfig is known up front.
/// struct Fixed(Kubeconfig);
///
/// #[async_trait]
/// impl RemoteCluster for Fixed {
///     fn id(&self) -> &str {
///         "fixed"
///     }
///
///     async fn config(&self) -> Result<Kubeconfig> {
///         Ok(self.0.clone())
///     }
/// }
/// ```
#[async_trait]
pub trait RemoteCluster: Send + Sync {
    /// A stable id, unique among the clusters a tree talks to.
    fn id(&self) -> &str;

    /// The kubeconfig to reach the cluster.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotFound`] when the kubeconfig no longer exists (during
    /// deprovision this means the cluster is gone, and its contents with
    /// it).
    async fn config(&self) -> Result<Kubeconfig>;

    /// The Secret the kubeconfig is read from, if it is read from one
    /// (default: none).
    ///
    /// The remote node puts a finalizer on it while its subtree exists, so
    /// that deleting the Secret (or its namespace) first does not leave the
    /// remote objects behind, claims it for the tree's owner, and records
    /// on it since when the cluster has not answered.
    fn secret(&self) -> Option<KubeconfigSecret> {
        None
    }

    /// The kubeconfig for a tree running on `parent` (the cluster the
    /// remote node runs on), or why there is none yet. Provision and plan
    /// both read it here: provision fails with a
    /// [`Missing`](KubeconfigRead::Missing) error, a plan shows it as
    /// unknown (the cluster may simply not exist yet).
    ///
    /// The default calls [`config`](RemoteCluster::config) and counts
    /// [`ErrorKind::NotFound`] as missing. Override it to learn something
    /// from `parent` (`provisioners-remote`'s Secret remote learns the
    /// service range its trust rules deny) or to report a kubeconfig that
    /// exists but is not usable yet as missing rather than as a failure.
    ///
    /// # Errors
    ///
    /// What fails the plan as it fails provision: the kubeconfig cannot be
    /// read (the API failed), or it breaks a rule.
    async fn read_config(&self, parent: &Cluster) -> Result<KubeconfigRead> {
        let _ = parent;
        match self.config().await {
            Ok(kubeconfig) => Ok(KubeconfigRead::Kubeconfig(Box::new(kubeconfig))),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(KubeconfigRead::Missing(error)),
            Err(error) => Err(error),
        }
    }
}

/// What [`RemoteCluster::read_config`] found: a kubeconfig or why there is
/// none, nothing else (so not `#[non_exhaustive]`: a remote node matches
/// both).
pub enum KubeconfigRead {
    /// The kubeconfig, ready to use.
    Kubeconfig(Box<Kubeconfig>),
    /// There is no usable kubeconfig (yet): the error provision returns,
    /// whose message a plan shows. [`ErrorKind::NotFound`] when its source
    /// is gone (during deprovision, the cluster went with it), another kind
    /// ([`ErrorKind::Invalid`]) when the source exists without a usable
    /// kubeconfig (a Secret without its key).
    Missing(Error),
}

/// Never the kubeconfig: it holds credentials.
impl fmt::Debug for KubeconfigRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KubeconfigRead::Kubeconfig(_) => f.write_str("Kubeconfig(..)"),
            KubeconfigRead::Missing(error) => f.debug_tuple("Missing").field(error).finish(),
        }
    }
}

impl KubeconfigRead {
    /// The kubeconfig, or the error provision fails with.
    ///
    /// # Errors
    ///
    /// The [`Missing`](KubeconfigRead::Missing) error.
    pub fn into_config(self) -> Result<Kubeconfig> {
        match self {
            KubeconfigRead::Kubeconfig(kubeconfig) => Ok(*kubeconfig),
            KubeconfigRead::Missing(error) => Err(error),
        }
    }
}

/// The Secret a [`RemoteCluster`]'s kubeconfig is read from: its namespace
/// and name, and the client that reads it (the Secret lives on that
/// client's cluster, which need not be the one the tree runs on).
#[derive(Clone)]
pub struct KubeconfigSecret {
    client: kube::Client,
    namespace: String,
    name: String,
}

impl KubeconfigSecret {
    /// Secret `namespace/name`, reached with `client`.
    pub fn new(
        client: kube::Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        KubeconfigSecret {
            client,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The client the Secret is read and updated with.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The Secret's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Secret's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for KubeconfigSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeconfigSecret")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// `Box`, `Arc` and `&` of a remote are the remote: a shared
/// `Arc<dyn RemoteCluster>` can be handed to whatever takes one.
macro_rules! forward {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<R: RemoteCluster + ?Sized> RemoteCluster for $ty {
            fn id(&self) -> &str {
                (**self).id()
            }

            async fn config(&self) -> Result<Kubeconfig> {
                (**self).config().await
            }

            fn secret(&self) -> Option<KubeconfigSecret> {
                (**self).secret()
            }

            async fn read_config(&self, parent: &Cluster) -> Result<KubeconfigRead> {
                (**self).read_config(parent).await
            }
        }
    )*};
}

forward!(Box<R>, Arc<R>, &R);

#[cfg(test)]
mod tests {
    use super::*;

    struct Gone;

    #[async_trait]
    impl RemoteCluster for Gone {
        fn id(&self) -> &str {
            "gone"
        }

        async fn config(&self) -> Result<Kubeconfig> {
            Err(Error::not_found("Secret a/b does not exist"))
        }
    }

    struct Refused;

    #[async_trait]
    impl RemoteCluster for Refused {
        fn id(&self) -> &str {
            "refused"
        }

        async fn config(&self) -> Result<Kubeconfig> {
            Err(Error::invalid("the kubeconfig leads to a loopback address"))
        }
    }

    struct Fixed;

    #[async_trait]
    impl RemoteCluster for Fixed {
        fn id(&self) -> &str {
            "fixed"
        }

        async fn config(&self) -> Result<Kubeconfig> {
            Ok(Kubeconfig {
                current_context: Some("x".into()),
                ..Kubeconfig::default()
            })
        }
    }

    fn cluster() -> Cluster {
        crate::Context::offline().cluster().clone()
    }

    #[tokio::test]
    async fn by_default_a_remote_has_no_secret_and_reads_its_config() {
        let parent = cluster();
        assert!(Fixed.secret().is_none());
        let read = Fixed.read_config(&parent).await.unwrap();
        assert_eq!(
            read.into_config().unwrap().current_context.as_deref(),
            Some("x")
        );
    }

    #[tokio::test]
    async fn by_default_only_a_kubeconfig_not_found_is_missing() {
        let parent = cluster();
        match Gone.read_config(&parent).await.unwrap() {
            KubeconfigRead::Missing(error) => {
                assert_eq!(error.kind(), ErrorKind::NotFound);
                assert_eq!(error.message(), "Secret a/b does not exist");
            }
            KubeconfigRead::Kubeconfig(_) => panic!("a kubeconfig that does not exist"),
        }
        let refused = Refused.read_config(&parent).await.unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Invalid);
    }

    /// A remote that names its Secret, shared as `Arc<dyn RemoteCluster>`.
    struct InSecret(kube::Client);

    #[async_trait]
    impl RemoteCluster for InSecret {
        fn id(&self) -> &str {
            "in-secret"
        }

        async fn config(&self) -> Result<Kubeconfig> {
            Err(Error::invalid("key `value` is missing"))
        }

        fn secret(&self) -> Option<KubeconfigSecret> {
            Some(KubeconfigSecret::new(
                self.0.clone(),
                "clusters",
                "c1-kubeconfig",
            ))
        }

        async fn read_config(&self, _: &Cluster) -> Result<KubeconfigRead> {
            Ok(KubeconfigRead::Missing(self.config().await.unwrap_err()))
        }
    }

    #[tokio::test]
    async fn a_shared_remote_forwards_its_secret_and_its_read() {
        let parent = cluster();
        let shared: Arc<dyn RemoteCluster> = Arc::new(InSecret(parent.client().clone()));
        let boxed: Box<dyn RemoteCluster> = Box::new(Arc::clone(&shared));
        assert_eq!(boxed.id(), "in-secret");
        let secret = boxed.secret().expect("the Secret is forwarded");
        assert_eq!(
            (secret.namespace(), secret.name()),
            ("clusters", "c1-kubeconfig")
        );
        assert!(format!("{secret:?}").contains("c1-kubeconfig"));
        match boxed.read_config(&parent).await.unwrap() {
            KubeconfigRead::Missing(error) => assert_eq!(error.kind(), ErrorKind::Invalid),
            KubeconfigRead::Kubeconfig(_) => panic!("the override is forwarded, not the default"),
        }
    }
}
