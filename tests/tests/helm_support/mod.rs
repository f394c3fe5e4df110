//! Helpers shared by the helm cluster test binaries.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::config::Kubeconfig;
use provisioners::{Context, Provisioner};
use provisioners_helm::{Chart, DIGEST_LABEL, HelmFailure};
use provisioners_lab::cluster::{self, HarnessCluster, TestNamespace};

/// Generous for 2 cores running control planes and a parallel test suite.
pub const DEADLINE: Duration = Duration::from_secs(120);
pub const WAIT: Duration = Duration::from_secs(120);
pub const SECRET: &str = "pa55-word-that-must-not-leak-7f3a";

/// The tests of a binary's helm scenarios, each on the majors it is listed
/// under: `both` on Helm 3 and Helm 4 (the majors behave differently
/// there), `helm3` or `helm4` on that one alone, so both majors keep broad
/// coverage at half the cost. docs/testing.md lists which scenario runs
/// where and why. The tests are `helm3::<scenario>` and `helm4::<scenario>`,
/// so `cargo test -- helm4::` runs one major. A scenario listed nowhere is
/// an unused function (a warning, an error under clippy's `-D warnings`);
/// one listed twice for a major is a duplicate test.
#[macro_export]
macro_rules! helm_scenarios {
    (
        both: [$($both:ident),* $(,)?],
        helm3: [$($three:ident),* $(,)?],
        helm4: [$($four:ident),* $(,)?] $(,)?
    ) => {
        mod helm3 {
            $($crate::helm_test!(helm3, "PROVISIONERS_HELM3", $both);)*
            $($crate::helm_test!(helm3, "PROVISIONERS_HELM3", $three);)*
        }
        mod helm4 {
            $($crate::helm_test!(helm4, "PROVISIONERS_HELM4", $both);)*
            $($crate::helm_test!(helm4, "PROVISIONERS_HELM4", $four);)*
        }
    };
}

/// One cluster test: `scenario` with the helm binary of `major`.
#[macro_export]
macro_rules! helm_test {
    ($major:ident, $variable:literal, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "needs the local control plane (cargo xtask test)"]
        async fn $scenario() {
            super::$scenario(provisioners_lab::cluster::$major().expect($variable)).await;
        }
    };
}

pub fn chart(name: &str) -> Chart {
    Chart::local(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("charts")
            .join(name),
    )
}

/// A context over a Cluster of its own. The release locks live on the
/// Cluster: a second context of the same "process" is `cx.clone()` (with
/// another token, say), not a second call.
pub async fn context() -> Context {
    context_as("helm-tests").await
}

/// A context whose cluster has the id `id`, over a Cluster of its own: two
/// calls are two "processes" to the release locks (which live on the
/// Cluster) and to the helm process bound; only the Lease serialises them.
pub async fn context_as(id: &str) -> Context {
    let path = HarnessCluster::Primary
        .kubeconfig_path()
        .expect("PROVISIONERS_KUBECONFIG");
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig");
    Context::new(
        provisioners::client::connect(id.to_owned(), kubeconfig)
            .await
            .expect("cluster"),
    )
}

/// A private directory for the release's work directories, so a test can
/// tell that nothing was left behind.
pub fn temp_root() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("helm-test-")
        .tempdir()
        .expect("temp dir")
}

pub fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("read temp root")
        .map(|e| e.expect("entry").path())
        .collect()
}

/// Polls `check` every 20 ms until it returns `Some`, or panics with `what`.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    cluster::eventually(what, DEADLINE, Duration::from_millis(20), check).await
}

/// The newest revision's (number, status, digest label) from helm's records.
pub async fn release_record(
    ns: &TestNamespace,
    release: &str,
) -> Option<(u32, String, Option<String>)> {
    let secrets = ns
        .api::<Secret>()
        .list_metadata(&ListParams::default().labels(&format!("owner=helm,name={release}")))
        .await
        .expect("list release records");
    secrets
        .items
        .into_iter()
        .map(|s| {
            let labels: BTreeMap<String, String> = s.metadata.labels.unwrap_or_default();
            (
                labels["version"].parse::<u32>().expect("version label"),
                labels["status"].clone(),
                labels.get(DIGEST_LABEL).cloned(),
            )
        })
        .max_by_key(|r| r.0)
}

pub async fn available(ns: &TestNamespace, name: &str) -> Option<i32> {
    let deployment = ns
        .api::<Deployment>()
        .get_opt(name)
        .await
        .expect("get deployment")?;
    deployment.status.and_then(|s| s.available_replicas)
}

/// A helm process seen in /proc: its pid, arguments and environment.
pub struct HelmProcess {
    pub pid: u32,
    pub args: Vec<String>,
    pub environ: Vec<u8>,
    pub cmdline: Vec<u8>,
}

impl HelmProcess {
    pub fn flag(&self, name: &str) -> Option<&str> {
        let i = self.args.iter().position(|a| a == name)?;
        self.args.get(i + 1).map(String::as_str)
    }
}

/// Live (not zombie) helm processes started from `helm` whose arguments name `namespace`.
pub fn helm_processes(helm: &Path, namespace: &str) -> Vec<HelmProcess> {
    let mut found = Vec::new();
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in proc.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.first().map(Path::new) != Some(helm) || !args.iter().any(|a| a == namespace) {
            continue;
        }
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| stat.contains(") Z "))
            .unwrap_or(true);
        if zombie {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        found.push(HelmProcess {
            pid,
            args,
            environ,
            cmdline,
        });
    }
    found
}

pub fn mode(path: &str) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o777)
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read chart") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// Provisions `node` again after each yield (what a controller's requeue
/// does) until it is done; any other error fails the test.
pub async fn settle(cx: &Context, node: &(impl Provisioner + ?Sized), what: &str) {
    cluster::eventually(what, DEADLINE, Duration::from_millis(200), || async move {
        match cx.provision(node).await {
            Ok(()) => Some(()),
            Err(e) if e.is_yield() => None,
            Err(e) => panic!("{what}: {e}"),
        }
    })
    .await;
}

pub async fn deprovision_until_gone(cx: &Context, node: &(impl Provisioner + ?Sized)) {
    eventually("deprovision to finish", || async move {
        match cx.deprovision(node).await {
            Ok(()) => Some(()),
            Err(e) if e.is_yield() => None,
            Err(e) => panic!("deprovision failed: {e}"),
        }
    })
    .await;
}

/// The signal that killed the helm run behind `error`, read from its
/// source, a [`HelmFailure`].
pub fn killed_by(error: &provisioners::Error) -> Option<i32> {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<HelmFailure>())
        .expect("the source of a failed helm run is a HelmFailure")
        .signal
}

/// SIGKILLs every helm of `namespace` once the newest record has `status`.
pub async fn kill_helm_when(helm: &Path, ns: &TestNamespace, release: &str, status: &str) {
    eventually(&format!("the release to be {status}"), || async {
        release_record(ns, release).await.filter(|r| r.1 == status)
    })
    .await;
    for process in helm_processes(helm, ns.name()) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(process.pid).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("SIGKILL helm");
    }
}

/// A chart repository on loopback: `index.yaml` and the packaged chart,
/// served by a minimal HTTP/1.1 server that counts requests.
pub struct ChartRepository {
    pub url: String,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _dir: tempfile::TempDir,
    server: tokio::task::JoinHandle<()>,
}

impl ChartRepository {
    pub async fn start(helm: &Path) -> Self {
        Self::start_with(helm, None).await
    }

    /// With `authorization`, a request without exactly that header value
    /// (`Basic base64(user:password)`) gets a 401.
    pub async fn start_with(helm: &Path, authorization: Option<&'static str>) -> Self {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plain");
        Self::serving(helm, &chart, authorization).await
    }

    /// A repository of the chart directory `chart`, packaged.
    pub async fn serving(helm: &Path, chart: &Path, authorization: Option<&'static str>) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let dir = temp_root();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let package = std::process::Command::new(helm)
            .arg("package")
            .arg(chart)
            .arg("--destination")
            .arg(dir.path())
            .output()
            .expect("helm package");
        assert!(package.status.success(), "{package:?}");
        let index = std::process::Command::new(helm)
            .args(["repo", "index"])
            .arg(dir.path())
            .args(["--url", &url])
            .output()
            .expect("helm repo index");
        assert!(index.status.success(), "{index:?}");

        let requests = Arc::new(AtomicUsize::new(0));
        let root = dir.path().to_owned();
        let counter = Arc::clone(&requests);
        let server = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let root = root.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buffer[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&request);
                    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let file = root.join(path.trim_start_matches('/'));
                    let authorized = authorization.is_none_or(|expected| {
                        line.lines().any(|header| {
                            header.split_once(':').is_some_and(|(name, value)| {
                                name.eq_ignore_ascii_case("authorization")
                                    && value.trim() == expected
                            })
                        })
                    });
                    if !authorized {
                        let _ = stream
                            .write_all(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"charts\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                            .await;
                        let _ = stream.shutdown().await;
                        return;
                    }
                    let response = match std::fs::read(&file) {
                        Ok(body) if !path.contains("..") => {
                            let mut r = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            r.extend_from_slice(&body);
                            r
                        }
                        _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_vec(),
                    };
                    let _ = stream.write_all(&response).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        ChartRepository {
            url,
            requests,
            _dir: dir,
            server,
        }
    }

    pub fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for ChartRepository {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The OCI registry (CNCF distribution) from `cargo xtask tools`:
/// `PROVISIONERS_REGISTRY`, else its place in the tool cache next to Helm 3.
pub fn registry_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PROVISIONERS_REGISTRY").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let helm3 = cluster::helm3().expect("PROVISIONERS_HELM3");
    helm3
        .parent()
        .and_then(Path::parent)
        .expect("the tool cache")
        .join("registry-v3.1.2/registry")
}

/// An OCI registry on loopback, with basic auth when `htpasswd` is given
/// (bcrypt lines, as the registry reads them); stopped on drop.
pub struct OciRegistry {
    pub host: String,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl OciRegistry {
    pub async fn start(htpasswd: Option<&str>) -> Self {
        let dir = temp_root();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let host = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n",
            dir.path().join("storage").display()
        );
        if let Some(htpasswd) = htpasswd {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, htpasswd).expect("htpasswd");
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: charts\n    path: {}\n",
                file.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).expect("registry config");
        let child = std::process::Command::new(registry_binary())
            .arg("serve")
            .arg(&config_path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the registry (cargo xtask tools builds it)");
        let registry = OciRegistry {
            host,
            child,
            _dir: dir,
        };
        cluster::eventually(
            "the registry to listen",
            DEADLINE,
            Duration::from_millis(50),
            || async {
                tokio::net::TcpStream::connect(&registry.host)
                    .await
                    .ok()
                    .map(drop)
            },
        )
        .await;
        registry
    }

    /// Packages `chart` and pushes it to `oci://HOST/charts`, logged in with
    /// `credentials` (username, password on stdin) in a private helm config.
    pub fn push(&self, helm: &Path, chart: &Path, credentials: Option<(&str, &str)>) {
        use std::io::Write as _;
        let home = temp_root();
        let env = |cmd: &mut std::process::Command| {
            cmd.env("HELM_CONFIG_HOME", home.path().join("config"))
                .env("HELM_CACHE_HOME", home.path().join("cache"))
                .env("HELM_DATA_HOME", home.path().join("data"));
        };
        let mut package = std::process::Command::new(helm);
        package
            .arg("package")
            .arg(chart)
            .arg("--destination")
            .arg(home.path());
        env(&mut package);
        let packaged = package.output().expect("helm package");
        assert!(packaged.status.success(), "{packaged:?}");
        if let Some((username, password)) = credentials {
            let mut login = std::process::Command::new(helm);
            login
                .args(["registry", "login", &self.host, "--plain-http"])
                .args(["--username", username, "--password-stdin"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            env(&mut login);
            let mut child = login.spawn().expect("helm registry login");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(password.as_bytes())
                .expect("password");
            let output = child.wait_with_output().expect("login");
            assert!(output.status.success(), "{output:?}");
        }
        let archive = std::fs::read_dir(home.path())
            .expect("read")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "tgz"))
            .expect("the packaged chart");
        let mut push = std::process::Command::new(helm);
        push.arg("push")
            .arg(&archive)
            .arg(format!("oci://{}/charts", self.host))
            .arg("--plain-http");
        env(&mut push);
        let pushed = push.output().expect("helm push");
        assert!(pushed.status.success(), "{pushed:?}");
    }
}

impl Drop for OciRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
