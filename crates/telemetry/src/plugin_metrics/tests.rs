use super::*;

fn counter(name: &str, labels: &[&str], max_values: u32) -> Declaration {
    Declaration {
        name: name.into(),
        help: format!("{name} help"),
        kind: Kind::Counter,
        labels: labels.iter().map(|l| l.to_string()).collect(),
        max_values,
        buckets: vec![],
    }
}

fn histogram(name: &str, buckets: &[f64]) -> Declaration {
    Declaration { kind: Kind::Histogram, buckets: buckets.to_vec(), ..counter(name, &[], 1) }
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

/// The exported lines that mention `namespace`.
fn exported(namespace: &str) -> Vec<String> {
    let text = crate::metrics::metrics().encode();
    text.lines().filter(|line| line.contains(&format!("namespace=\"{namespace}\""))).map(String::from).collect()
}

#[test]
fn past_a_cap_a_value_is_what_the_gateways_own_labels_call_it() {
    assert_eq!(OTHER, crate::metrics::OTHER);
}

#[test]
fn declarations_are_checked() {
    assert_eq!(check(&[counter("calls", &["result"], 4), histogram("latency", &[0.1, 1.0])]), Ok(()));
    let refused = [
        (vec![counter("Calls", &[], 1)], "a name is"),
        (vec![counter("9calls", &[], 1)], "a name is"),
        (vec![counter(&"x".repeat(65), &[], 1)], "a name is"),
        (vec![counter("calls", &[], 1), counter("calls", &[], 1)], "declared twice"),
        (vec![counter("calls", &["a", "b", "c", "d", "e"], 1)], "at most 4 labels"),
        (vec![counter("calls", &["plugin"], 1)], "one the gateway sets"),
        (vec![counter("calls", &["Bad"], 1)], "label `Bad`"),
        (vec![counter("calls", &["a", "a"], 1)], "label `a` is declared twice"),
        (vec![counter("calls", &["a"], 0)], "max-values"),
        (vec![counter("calls", &["a"], 65)], "max-values"),
        (vec![histogram("latency", &[1.0, 0.5])], "ascending"),
        (vec![histogram("latency", &[f64::NAN])], "ascending"),
        (vec![Declaration { buckets: vec![1.0], ..counter("calls", &[], 1) }], "a counter has no buckets"),
        (vec![Declaration { help: "two\nlines".into(), ..counter("calls", &[], 1) }], "one line"),
        ((0..17).map(|i| counter(&format!("m{i}"), &[], 1)).collect(), "at most 16"),
    ];
    for (declarations, why) in refused {
        let error = check(&declarations).expect_err(why);
        assert!(error.contains(why), "{error} (expected: {why})");
    }
}

#[test]
fn label_values_past_the_declared_cardinality_count_as_other() {
    let metrics = register("pm-card", "p", vec![counter("calls", &["result"], 2)]);
    for value in ["ok", "error", "timeout", "denied", "ok"] {
        assert!(metrics.add("calls", &strings(&[value]), 1));
    }
    assert!(metrics.add("calls", &strings(&[&"v".repeat(200)]), 1), "a long value counts as other");
    let lines = exported("pm-card");
    let count = |value: &str| {
        lines
            .iter()
            .find(|l| l.starts_with("sluice_plugin_calls_total{") && l.contains(&format!("result=\"{value}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    assert_eq!(
        (count("ok"), count("error"), count("other"), count("timeout")),
        (Some(2), Some(1), Some(3), None),
        "{lines:?}"
    );
}

#[test]
fn undeclared_names_and_wrong_label_counts_are_not_recorded() {
    let metrics = register("pm-undeclared", "p", vec![counter("calls", &["result"], 2), histogram("latency", &[])]);
    assert!(!metrics.add("nope", &strings(&["ok"]), 1));
    assert!(!metrics.add("calls", &strings(&[]), 1));
    assert!(!metrics.add("latency", &strings(&[]), 1), "a histogram is not a counter");
    assert!(!metrics.observe("calls", &strings(&["ok"]), 1.0), "a counter is not a histogram");
    assert!(metrics.observe("latency", &strings(&[]), 0.02));
    assert!(exported("pm-undeclared").iter().all(|line| !line.starts_with("sluice_plugin_calls")));
    let lines = exported("pm-undeclared");
    let bucket = lines.iter().find(|l| l.starts_with("sluice_plugin_latency_bucket{") && l.contains("le=\"0.025\""));
    assert!(bucket.is_some_and(|l| l.ends_with(" 1")), "the default buckets: {lines:?}");
}

#[test]
fn a_version_declaring_alike_carries_the_counts_on_and_one_declaring_otherwise_replaces_them() {
    let first = register("pm-versions", "p", vec![counter("calls", &[], 1)]);
    first.add("calls", &[], 5);
    let same = register("pm-versions", "p", vec![counter("calls", &[], 1)]);
    same.add("calls", &[], 1);
    assert!(exported("pm-versions").iter().any(|l| l.starts_with("sluice_plugin_calls_total{") && l.ends_with(" 6")));
    let other = register("pm-versions", "p", vec![counter("requests", &[], 1)]);
    other.add("requests", &[], 1);
    let lines = exported("pm-versions");
    assert!(
        lines.iter().all(|l| !l.starts_with("sluice_plugin_calls")),
        "the old shape is no longer exported: {lines:?}"
    );
    assert!(lines.iter().any(|l| l.starts_with("sluice_plugin_requests_total{")), "{lines:?}");
    drop((first, same, other));
    assert_eq!(exported("pm-versions"), Vec::<String>::new(), "a plugin that is gone is not exported");
}

#[test]
fn one_plugins_declaration_never_changes_how_anothers_is_exported() {
    // Two tenants pick one name, as a counter and as a histogram.
    let a = register("pm-clash-a", "p", vec![counter("verdicts", &["verdict"], 4)]);
    let b = register("pm-clash-b", "p", vec![histogram("verdicts", &[1.0])]);
    a.add("verdicts", &strings(&["block"]), 1);
    b.observe("verdicts", &[], 0.5);
    let text = crate::metrics::metrics().encode();
    assert!(text.contains("# TYPE sluice_plugin_verdicts_total counter"), "{text}");
    assert!(text.contains("# TYPE sluice_plugin_verdicts_histogram histogram"), "{text}");
    assert!(exported("pm-clash-a").iter().any(|l| l.starts_with("sluice_plugin_verdicts_total{")));
    assert!(exported("pm-clash-b").iter().any(|l| l.starts_with("sluice_plugin_verdicts_histogram_bucket{")));
    // Each name is described once, however many plugins export it.
    assert_eq!(text.matches("# TYPE sluice_plugin_verdicts_total counter").count(), 1);
}
