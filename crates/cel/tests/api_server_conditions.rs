//! Which match conditions Verno may place on a webhook entry for the API server to evaluate:
//! only what Kubernetes' webhook condition environment compiles. Kyverno's `request.object`
//! is not there (the API server refused the whole webhook configuration holding it, so no
//! policy of that configuration got its webhook on a real cluster); such a condition stays
//! with Verno, which evaluates every condition itself.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test fails by panicking

use verno_cel::api_server_condition;

#[test]
fn request_fields_the_api_server_lacks_keep_the_condition_with_verno() {
    assert!(!api_server_condition("has(request.object.metadata.labels) && has(request.object.metadata.labels.x)"));
    assert!(!api_server_condition("request.oldObject.metadata.name == 'a'"));
    assert!(!api_server_condition("request.userInfo.nickname == 'a'"));
    assert!(!api_server_condition("request.kind.plural == 'pods'"));
    assert!(!api_server_condition("request == null"));
    assert!(api_server_condition("request.operation == 'CREATE' && request.userInfo.username != 'system:admin'"));
    assert!(api_server_condition("request.kind.kind == 'Pod' && request.resource.resource == 'pods'"));
    assert!(api_server_condition("'system:masters' in request.userInfo.groups"));
    assert!(api_server_condition("request.options.dryRun == ['All']"));
    assert!(api_server_condition("has(object.metadata.labels) && object.metadata.labels.team == 'a'"));
}
