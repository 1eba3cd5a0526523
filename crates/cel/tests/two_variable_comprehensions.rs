//! cel-go's two-variable comprehensions, which Kubernetes' CEL (and so every Kyverno CEL
//! policy) has: over a list the index and the element, over a map the key and the value.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test fails by panicking

use serde_json::{Value, json};
use verno_cel::{Expr, Vars};

fn run(src: &str) -> Result<Value, String> {
    let mut v = Vars::default();
    v.set(
        "object",
        &json!({"metadata": {"labels": {"team": "a", "tier": "web"}},
            "spec": {"containers": [{"name": "app", "image": "nginx"}, {"name": "side", "image": "envoy"}]}}),
    );
    Expr::compile(src).map_err(|e| e.to_string())?.eval(&v).map_err(|e| e.to_string())
}

#[test]
fn all_exists_and_exists_one_see_both_variables() {
    assert_eq!(run("object.metadata.labels.all(k, v, k.size() > 1 && v != '')"), Ok(json!(true)));
    assert_eq!(run("object.metadata.labels.exists(k, v, k == 'tier' && v == 'web')"), Ok(json!(true)));
    assert_eq!(run("object.metadata.labels.exists(k, v, k == 'tier' && v == 'db')"), Ok(json!(false)));
    assert_eq!(run("object.spec.containers.all(i, c, i < 2 && c.image != '')"), Ok(json!(true)));
    assert_eq!(run("object.spec.containers.existsOne(i, c, c.name == 'side' && i == 1)"), Ok(json!(true)));
    assert_eq!(run("[1, 2, 2].exists_one(i, x, x == 2)"), Ok(json!(false)));
    // An error is absorbed by a decisive result, as in the one-variable form.
    assert_eq!(run("[0, 1].exists(i, x, 1 / x == 1)"), Ok(json!(true)));
    // The one-variable forms are untouched.
    assert_eq!(run("object.spec.containers.all(c, c.image != '')"), Ok(json!(true)));
}

#[test]
fn transforms_build_lists_and_maps() {
    assert_eq!(
        run("object.spec.containers.transformList(i, c, c.name + '-' + string(i))"),
        Ok(json!(["app-0", "side-1"]))
    );
    assert_eq!(run("[1, 2, 3, 4].transformList(i, x, x % 2 == 0, x * 10)"), Ok(json!([20, 40])));
    assert_eq!(run("object.metadata.labels.transformMap(k, v, v + '!')"), Ok(json!({"team": "a!", "tier": "web!"})));
    assert_eq!(run("object.metadata.labels.transformMap(k, v, k != 'team', v)"), Ok(json!({"tier": "web"})));
    assert_eq!(run("['a', 'b'].transformMap(i, x, x + x)"), Ok(json!({"0": "aa", "1": "bb"})));
    assert_eq!(
        run("object.spec.containers.transformMapEntry(i, c, {c.name: c.image})"),
        Ok(json!({"app": "nginx", "side": "envoy"}))
    );
    assert_eq!(run("object.metadata.labels.transformMapEntry(k, v, k == 'tier', {v: k})"), Ok(json!({"web": "tier"})));
    let dup = run("[1, 1].transformMapEntry(i, x, {'k': x})").unwrap_err();
    assert!(dup.contains("insert failed: key k already exists"), "{dup}");
    // Nested: each expansion binds its own target.
    assert_eq!(run("[[1, 2], [3]].transformList(i, l, l.transformList(j, x, i * 10 + j))"), Ok(json!([[0, 1], [10]])));
}
