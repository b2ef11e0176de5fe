//! A missing or unusable wrapper/engine fails closed.

use std::sync::Arc;

use serde_json::json;

use super::scratch_failure;
use crate::harness::{self, Invocation};
use crate::{Ctx, Finding};

pub async fn fails_closed(ctx: Arc<Ctx>) -> Finding {
    if ctx.options.fail_closed.is_empty() {
        return Finding::not_run(
            "no unusable configuration was given and the backend declares none \
             (BackendDescriptor::with_fail_closed, SuiteOptions::fail_closed, \
             --fail-closed-option): fail-closed behaviour was not verified",
        );
    }
    let mut cases = Vec::new();
    let mut failures = Vec::new();
    for case in &ctx.options.fail_closed {
        let backend = match &case.factory {
            Some(f) => f(),
            None => ctx.backend(),
        };
        let scratch = match ctx.scratch() {
            Ok(s) => s,
            Err(e) => return scratch_failure(e),
        };
        let inv = Invocation::sh("echo ran > fail-closed-ran; exit 0").options(&case.options);
        let outcome = harness::run(backend.as_ref(), &scratch, &inv).await;
        let ran_anyway = scratch.work_file("fail-closed-ran").exists()
            || scratch.root.join("fail-closed-ran").exists();
        let (verdict, seen) = match &outcome {
            Err(stage) => (None, json!({"refused": stage.to_string()})),
            Ok(ran) => {
                let e = &ran.evidence.exit;
                let reported_success = e.code == Some(0) && ran.evidence.failure.is_none();
                (
                    reported_success.then(|| {
                        "the launch reported success although the command cannot have run"
                            .to_string()
                    }),
                    json!({"exit": e, "failure": ran.evidence.failure, "stderr": harness::excerpt(&ran.stderr)}),
                )
            }
        };
        if ran_anyway {
            failures.push(format!("{}: the command ran", case.name));
        } else if let Some(v) = verdict {
            failures.push(format!("{}: {v}", case.name));
        }
        cases.push(json!({"case": case.name, "ran": ran_anyway, "seen": seen}));
    }
    let details = json!({"cases": cases});
    if failures.is_empty() {
        Finding::pass(details)
    } else {
        Finding::fail(failures.join("; "), details)
    }
}
