//! The AdmissionReview handler end to end, as `verno serve` runs it: parse the body, review it
//! on every route against a fixed policy set, write the answer. `BODY`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use verno_engine::{Filter, Hook, Route};
use verno_server::admission;

fuzz_target!(|data: &[u8]| {
    if admission::identify(data).is_err() {
        return;
    }
    let Ok(review) = admission::parse(data) else { return };
    let set = verno_fuzz::policy_set();
    for route in [
        Route::Kyverno(Hook::Mutate, Filter::All),
        Route::Kyverno(Hook::Validate, Filter::All),
        admission::cel_route(Hook::Validate, false, ""),
        admission::cel_route(Hook::Mutate, false, ""),
    ] {
        let _ = admission::allows_on_error(set, &route);
        let outcome = admission::review(set, route, &review);
        let _ = serde_json::to_vec(&outcome.review);
    }
    let _ = serde_json::to_vec(&admission::validate_policy_review(&review));
});
