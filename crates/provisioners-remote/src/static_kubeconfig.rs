//! [`StaticKubeconfig`]: a remote whose kubeconfig is known up front.

use std::fmt;

use kube::config::Kubeconfig;
use provisioners_core::{RemoteCluster, Result, async_trait};

/// A remote cluster whose kubeconfig is known when the tree is built.
#[derive(Clone)]
#[must_use]
pub struct StaticKubeconfig {
    id: String,
    kubeconfig: Kubeconfig,
}

impl StaticKubeconfig {
    /// A remote called `id` reached through `kubeconfig`.
    pub fn new(id: impl Into<String>, kubeconfig: Kubeconfig) -> Self {
        StaticKubeconfig {
            id: id.into(),
            kubeconfig,
        }
    }
}

#[async_trait]
impl RemoteCluster for StaticKubeconfig {
    fn id(&self) -> &str {
        &self.id
    }

    async fn config(&self) -> Result<Kubeconfig> {
        Ok(self.kubeconfig.clone())
    }
}

impl fmt::Debug for StaticKubeconfig {
    // The kubeconfig may hold credentials: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKubeconfig")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}
