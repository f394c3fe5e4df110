//! Arbitrary bytes, and structured mutations of a real kubeconfig, through
//! what `SecretKubeconfig::read` does with a Secret's value (tenant input:
//! a tenant may supply its cluster's kubeconfig): UTF-8, the kubeconfig
//! parser, the local-reference check and the trust policy (names not
//! resolved here: no network in a unit test). Each property asserts no
//! panic, and an error or a value.
//!
//! Cases per property: 256 by default (a few seconds in `cargo xtask
//! test`); `cargo xtask fuzz` runs many more through
//! `PROVISIONERS_FUZZ_CASES`.

use kube::config::Kubeconfig;
use proptest::collection::vec;
use proptest::prelude::*;

use super::local_reference;
use crate::trust::TrustPolicy;

fn cases() -> u32 {
    std::env::var("PROVISIONERS_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A kubeconfig as Cluster API writes one into `<cluster>-kubeconfig`.
const SEED: &str = "apiVersion: v1
kind: Config
clusters:
- name: prod-eu-1
  cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUM=
    server: https://10.20.30.40:6443
contexts:
- name: prod-eu-1-admin@prod-eu-1
  context:
    cluster: prod-eu-1
    user: prod-eu-1-admin
current-context: prod-eu-1-admin@prod-eu-1
users:
- name: prod-eu-1-admin
  user:
    client-certificate-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t
    client-key-data: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQ==
";

fn mutate(bytes: &mut Vec<u8>, (kind, at, byte): (u8, usize, u8)) {
    let len = bytes.len();
    let at = if len == 0 { 0 } else { at % len };
    match kind % 5 {
        0 if len > 0 => bytes[at] = byte,
        1 => bytes.insert(at, byte),
        2 if len > 0 => {
            bytes.remove(at);
        }
        3 => bytes.truncate(at),
        4 if len > 0 => {
            let end = (at + usize::from(byte) + 1).min(len);
            let slice = bytes[at..end].to_vec();
            bytes.splice(at..at, slice);
        }
        _ => bytes.push(byte),
    }
}

/// What `read` does with a Secret's value, without the API: `Ok` for a
/// kubeconfig it would use, `Err` with the reason otherwise.
fn read(value: &[u8]) -> Result<Kubeconfig, String> {
    let text = std::str::from_utf8(value).map_err(|_| "not UTF-8".to_owned())?;
    let kubeconfig = provisioners_client::bounded::kubeconfig_from_yaml(text)
        .map_err(|_| "not a kubeconfig".to_owned())?;
    if let Some(field) = local_reference(&kubeconfig) {
        return Err(format!("uses {field}"));
    }
    let policy = TrustPolicy::default().resolve_hosts(false);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| e.to_string())?;
    runtime
        .block_on(policy.check(&kubeconfig, "Secret tenant/prod-eu-1-kubeconfig", None))
        .map_err(|e| e.to_string())?;
    Ok(kubeconfig)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_are_a_kubeconfig_or_refused(bytes in vec(any::<u8>(), 0..2048)) {
        let _ = read(&bytes);
    }

    #[test]
    fn a_mutated_real_kubeconfig_is_a_kubeconfig_or_refused(
        ops in vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..12),
    ) {
        let mut bytes = SEED.as_bytes().to_vec();
        for op in ops {
            mutate(&mut bytes, op);
        }
        if let Ok(kubeconfig) = read(&bytes) {
            // What was accepted names no command and no local file.
            prop_assert!(local_reference(&kubeconfig).is_none());
        }
    }

    #[test]
    fn a_kubeconfig_with_hostile_fields_is_refused(
        field in prop_oneof![
            Just("    insecure-skip-tls-verify: true\n"),
            Just("    proxy-url: http://10.0.0.9:3128\n"),
            Just("    tls-server-name: kubernetes\n"),
        ],
    ) {
        let text = SEED.replace(
            "    server: https://10.20.30.40:6443\n",
            &format!("    server: https://10.20.30.40:6443\n{field}"),
        );
        prop_assert!(read(text.as_bytes()).is_err());
    }
}

/// The seed is accepted as it is: the mutations start from a kubeconfig
/// the policy takes.
#[test]
fn the_seed_is_a_kubeconfig_the_policy_accepts() {
    let kubeconfig = read(SEED.as_bytes()).expect("the seed");
    assert_eq!(kubeconfig.clusters.len(), 1);
}
