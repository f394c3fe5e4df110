//! A kube-apiserver restart in the middle of a large provision.
//!
//! In `cluster_exclusive`, holding its lock, so that no other test runs
//! while the API server is down (cargo runs test binaries one after another).

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use provisioners::Context;
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_manifest::Manifest;

const OBJECTS: usize = 3000;

fn cluster_dir() -> PathBuf {
    let kubeconfig = HarnessCluster::Primary
        .kubeconfig_path()
        .expect("kubeconfig");
    kubeconfig
        .parent()
        .expect("cluster directory")
        .to_path_buf()
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Stops kube-apiserver (SIGTERM) and starts it again with the same command
/// line and environment, recording the new process in `state.json` so that
/// `cargo xtask cluster down` still stops it.
#[expect(
    clippy::zombie_processes,
    reason = "the new kube-apiserver outlives the test; `cargo xtask cluster down` stops it"
)]
fn restart_apiserver(dir: &Path) {
    let state_path = dir.join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_path).expect("state.json")).expect("json");
    let entry = state["processes"]
        .as_array_mut()
        .expect("processes")
        .iter_mut()
        .find(|p| p["component"] == "kube-apiserver")
        .expect("kube-apiserver in state.json");
    let pid = u32::try_from(entry["pid"].as_u64().expect("pid")).expect("pid fits");
    let split = |bytes: Vec<u8>| -> Vec<String> {
        bytes
            .split(|b| *b == 0)
            .filter(|part| !part.is_empty())
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect()
    };
    let argv = split(std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline"));
    let environ = split(std::fs::read(format!("/proc/{pid}/environ")).expect("environ"));

    // SIGTERM first, as an orderly restart does; its graceful shutdown waits
    // for long-running requests, so SIGKILL after a few seconds (a crash).
    for (signal, wait) in [
        ("-TERM", Duration::from_secs(5)),
        ("-KILL", Duration::from_secs(30)),
    ] {
        let _ = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status();
        let deadline = Instant::now() + wait;
        while start_time(pid).is_some() && !is_zombie(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert!(
        start_time(pid).is_none() || is_zombie(pid),
        "kube-apiserver {pid} did not stop"
    );

    let log = OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("logs/kube-apiserver.log"))
        .expect("log");
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env_clear()
        .envs(environ.iter().filter_map(|kv| kv.split_once('=')))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .process_group(0);
    let child = command.spawn().expect("start kube-apiserver");
    let new_pid = child.id();
    entry["pid"] = new_pid.into();
    entry["start_time"] = start_time(new_pid).expect("start time").into();
    std::fs::write(
        &state_path,
        serde_json::to_vec_pretty(&state).expect("json"),
    )
    .expect("write");
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_apiserver_restart_mid_provision_is_transient_and_the_next_provision_converges() {
    let _alone = crate::ALONE.write().await;
    let ns = TestNamespace::create("manifest-restart")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let yaml: String = (0..OBJECTS)
        .map(|i| {
            format!(
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i:04}\ndata:\n  \
                 index: \"{i}\"\n"
            )
        })
        .collect();
    let manifest = Manifest::from_yaml("restart", yaml)
        .namespace(ns.name())
        .concurrency(4);
    let api = ns.api::<ConfigMap>();

    let provision = {
        let cx = cx.clone();
        tokio::spawn(async move {
            let result = cx.provision(&manifest).await;
            (manifest, result)
        })
    };
    // Restart once the provision is well under way.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let count = api
            .list_metadata(&ListParams::default().limit(1000))
            .await
            .expect("list")
            .items
            .len();
        if count >= 100 {
            break;
        }
        assert!(Instant::now() < deadline, "the provision did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dir = cluster_dir();
    tokio::task::spawn_blocking(move || restart_apiserver(&dir))
        .await
        .expect("restart");

    let (manifest, result) = provision.await.expect("provision task");
    let error = result.expect_err("the provision cannot have succeeded across the restart");
    assert!(
        error.is_transient(),
        "a restart must be a transient failure or a yield, got: {error:?}"
    );
    eprintln!("during the restart: {error}");

    // The next provisions converge once the API server is back.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match cx.provision(&manifest).await {
            Ok(()) => break,
            Err(e) if e.is_transient() => {
                assert!(Instant::now() < deadline, "did not converge: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("after the restart: {e}"),
        }
    }
    let mut names = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.expect("list");
        for config_map in &page.items {
            let name = config_map.metadata.name.clone().unwrap_or_default();
            if let Some(index) = name.strip_prefix("cm-") {
                let data = config_map.data.clone().unwrap_or_default();
                assert_eq!(
                    data.get("index").map(String::as_str),
                    Some(index.trim_start_matches('0'))
                        .filter(|s| !s.is_empty())
                        .or(Some("0")),
                    "{name}"
                );
                names.push(name);
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(names.len(), OBJECTS, "objects missing after the restart");
    ns.cleanup().await.expect("cleanup");
}
