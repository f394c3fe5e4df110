//! The floor for `cargo xtask bench manifest`: a bare kube-rs loop that
//! server-side-applies every object of one YAML file, 32 requests at once,
//! and nothing else (no ordering, no ownership checks, no no-op detection,
//! no retries), so the benchmark can show how close `Manifest` comes to the
//! API server's own limit on the machine.
//!
//! ```sh
//! KUBECONFIG=... cargo run --release --example bare_apply -- --namespace NS FILE
//! ```

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Instant;

use futures::{StreamExt, stream};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiResource, Scope, pinned_kind};

const CONCURRENCY: usize = 32;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (namespace, file) = match args.as_slice() {
        [flag, namespace, file] if flag == "--namespace" => (namespace.clone(), file.clone()),
        _ => {
            eprintln!("usage: bare_apply --namespace NS FILE");
            return ExitCode::from(2);
        }
    };
    match run(&namespace, &file).await {
        Ok(count) => {
            eprintln!("applied {count} objects");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(namespace: &str, file: &str) -> anyhow::Result<usize> {
    let started = Instant::now();
    let client = kube::Client::try_default().await?;
    let text = std::fs::read_to_string(file)?;
    let objects: Vec<DynamicObject> = serde_saphyr::from_multiple(&text)?;
    let mut kinds: HashMap<GroupVersionKind, (ApiResource, bool)> = HashMap::new();
    let mut calls = Vec::with_capacity(objects.len());
    for object in &objects {
        let types = object
            .types
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("an object without apiVersion/kind"))?;
        let gvk = GroupVersionKind::try_from(types)?;
        if !kinds.contains_key(&gvk) {
            let (resource, capabilities) = pinned_kind(&client, &gvk).await?;
            kinds.insert(
                gvk.clone(),
                (resource, capabilities.scope == Scope::Namespaced),
            );
        }
        let (resource, namespaced) = &kinds[&gvk];
        let api: Api<DynamicObject> = if *namespaced {
            let ns = object.metadata.namespace.as_deref().unwrap_or(namespace);
            Api::namespaced_with(client.clone(), ns, resource)
        } else {
            Api::all_with(client.clone(), resource)
        };
        calls.push((
            api,
            object.metadata.name.clone().unwrap_or_default(),
            object,
        ));
    }
    let params = PatchParams::apply("bare");
    let results: Vec<kube::Result<DynamicObject>> = stream::iter(calls)
        .map(|(api, name, object)| {
            let params = &params;
            async move { api.patch(&name, params, &Patch::Apply(object)).await }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let count = results.len();
    for result in results {
        result?;
    }
    eprintln!("applied in {:.3}s", started.elapsed().as_secs_f64());
    Ok(count)
}
