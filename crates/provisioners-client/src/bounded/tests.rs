use std::io::Write as _;

use super::*;

/// Limits that a big input (a helm release record) would take.
const LARGE: Limits = Limits {
    text: 64 << 20,
    nodes: 1 << 20,
    heap: 40 << 20,
    depth: 64,
};

/// A gzip of `{"config":[0,0,…]}` with `zeros` zeros, written without
/// holding the text.
fn zeros_bomb(zeros: usize) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(b"{\"config\":[0").unwrap();
    let chunk = ",0".repeat(4096);
    for _ in 0..zeros / 4096 {
        encoder.write_all(chunk.as_bytes()).unwrap();
    }
    encoder.write_all(b"]}").unwrap();
    encoder.finish().unwrap()
}

#[test]
fn values_within_the_budget_parse_as_serde_json_does() {
    let text = br#"{"a":[1,-2,3.5,"x",null,true,{"b":{}}],"c":"\u00e9","d":[]}"#;
    let parsed = parse(&text[..], LARGE).unwrap();
    let expected: Value = serde_json::from_slice(text).unwrap();
    assert_eq!(parsed.tree, expected);
    assert!(parsed.weight > 0);
    let trailing = parse(&b"{\"a\":1} x"[..], LARGE).unwrap_err();
    assert!(matches!(trailing, Refused::Syntax(_)), "{trailing}");
    assert!(!trailing.is_over_budget());
    let cut = parse(&b"{\"a\":"[..], LARGE).unwrap_err();
    assert!(cut.to_string().starts_with("not JSON"), "{cut}");
}

#[test]
fn a_gzip_bomb_of_numbers_is_refused_by_its_parsed_size_early() {
    // 33 million zeros in ~64 KB: a gigabyte as a value tree.
    let bomb = zeros_bomb(33_000_000);
    assert!(bomb.len() < 200_000, "{}", bomb.len());
    let decoder = flate2::read::GzDecoder::new(bomb.as_slice());
    let error = parse(decoder, LARGE).unwrap_err();
    assert_eq!(error, Refused::Nodes { limit: LARGE.nodes });
    assert_eq!(error.to_string(), "more than 1048576 values when parsed");
}

#[test]
fn many_small_objects_are_charged_for_their_map_nodes() {
    // 8 bytes of text, ~700 bytes of tree each: the node count alone
    // would let 1 million through (700 MB).
    let mut text = b"[".to_vec();
    for i in 0..200_000 {
        if i > 0 {
            text.push(b',');
        }
        text.extend_from_slice(b"{\"a\":0}");
    }
    text.push(b']');
    let error = parse(text.as_slice(), LARGE).unwrap_err();
    assert_eq!(error.to_string(), "more than 40 MiB when parsed");
}

#[test]
fn text_nodes_and_depth_each_have_a_limit() {
    let small = Limits {
        text: 16,
        nodes: 4,
        heap: 1 << 20,
        depth: 2,
    };
    let long = parse(&br#"{"a":"0123456789abcdef"}"#[..], small).unwrap_err();
    assert_eq!(long.to_string(), "larger than 16 bytes");
    let many = parse(&b"[1,2,3,4]"[..], small).unwrap_err();
    assert_eq!(many.to_string(), "more than 4 values when parsed");
    let deep = parse(&b"[[[1]]]"[..], small).unwrap_err();
    assert_eq!(deep.to_string(), "nested more than 2 levels deep");
    assert_eq!(
        parse(&b"[[1]]"[..], small).unwrap().tree,
        serde_json::json!([[1]])
    );
}

#[test]
fn the_small_budgets_stop_what_their_inputs_cannot_be() {
    // A huge string in an annotation: over its text limit.
    let huge = format!("{{\"owner\":\"{}\"}}", "a".repeat(300 << 10));
    assert_eq!(
        parse(huge.as_bytes(), Limits::ANNOTATION).unwrap_err(),
        Refused::Text { limit: 256 << 10 }
    );
    // Deep nesting in a ConfigMap key.
    let deep = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
    assert_eq!(
        parse(deep.as_bytes(), Limits::CONFIG_MAP).unwrap_err(),
        Refused::Depth { limit: 32 }
    );
    // Many tiny objects in an annotation (8 bytes of text each).
    let tiny = format!("[{}{{}}]", r#"{"a":0},"#.repeat(30_000));
    assert!(tiny.len() < 256 << 10);
    assert!(
        parse(tiny.as_bytes(), Limits::ANNOTATION)
            .unwrap_err()
            .is_over_budget()
    );
}

#[test]
fn from_slice_builds_a_typed_value_or_says_why_not() {
    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Entry {
        name: String,
    }
    let entries: Vec<Entry> = from_slice(br#"[{"name":"a"}]"#, Limits::CONFIG_MAP).unwrap();
    assert_eq!(entries, [Entry { name: "a".into() }]);
    let shape = from_slice::<Vec<Entry>>(br#"[{"nom":"a"}]"#, Limits::CONFIG_MAP).unwrap_err();
    assert!(matches!(shape, Refused::Shape(_)), "{shape}");
    assert!(
        shape.to_string().contains("missing field `name`"),
        "{shape}"
    );
}

#[test]
fn kubeconfigs_parse_within_their_budget_and_the_error_never_quotes_them() {
    let yaml = "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster:\n    server: https://a:6443\nusers:\n- name: u\n  user:\n    token: s3cr3t\n";
    let config = kubeconfig_from_yaml(yaml).unwrap();
    assert_eq!(config.auth_infos[0].name, "u");

    // An alias bomb: a few hundred bytes that replay into millions of events.
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 0..8 {
        let prev = (b'a' + level) as char;
        let next = (b'a' + level + 1) as char;
        bomb.push_str(&format!(
            "{next}: &{next} [{}]\n",
            vec![format!("*{prev}"); 10].join(", ")
        ));
    }
    let error = kubeconfig_from_yaml(&bomb).unwrap_err();
    assert!(error.is_over_budget(), "{error}");

    let many = format!("clusters:\n{}", "- name: x\n".repeat(20_000));
    let error = kubeconfig_from_yaml(&many).unwrap_err();
    assert_eq!(error, Refused::Nodes { limit: 16_384 });

    let huge = format!(
        "users:\n- name: u\n  user:\n    token: {}\n",
        "t".repeat(2 << 20)
    );
    assert_eq!(
        kubeconfig_from_yaml(&huge).unwrap_err(),
        Refused::Text {
            limit: KUBECONFIG_BYTES as u64
        }
    );

    let error = kubeconfig_from_yaml("users: [{name: u, user: {token: s3cr3t}}").unwrap_err();
    assert!(!error.to_string().contains("s3cr3t"), "{error}");
    let error = kubeconfig_from_yaml("users: s3cr3t").unwrap_err();
    assert!(!error.to_string().contains("s3cr3t"), "{error}");
}

#[tokio::test]
async fn decoding_runs_off_the_async_workers() {
    let thread = std::thread::current().id();
    let other = off_workers(move || std::thread::current().id() != thread)
        .await
        .unwrap();
    assert!(other);
}
