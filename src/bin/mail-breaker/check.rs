//! `mail-breaker check`: each member's `verify` (connect, EHLO, STARTTLS, AUTH for SMTP; the
//! provider's own check for the others; no message sent), all at once, one row each:
//! member, state, its breaker, the answer, the time.

use std::time::{Duration, Instant};

use mail_breaker::{Category, SendError, Transport};
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::output::Out;
use crate::stack::Stack;

struct Row {
    member: String,
    result: Result<(), SendError>,
    breaker: String,
    took: Duration,
}

pub async fn run(stack: &Stack, out: &Out) -> Result<Exit, Failure> {
    let mailer = &stack.mailer;
    let breakers = crate::breakers::states(mailer).await;
    let checks = mailer.breakers().map(|(name, breaker)| async move {
        let started = Instant::now();
        // A breaker's verify goes to its provider whatever its state.
        let result = breaker.verify().await;
        (name.to_owned(), result, started.elapsed())
    });
    let rows: Vec<Row> = futures::future::join_all(checks)
        .await
        .into_iter()
        .zip(breakers)
        .map(|((member, result, took), breaker)| Row {
            member,
            result,
            breaker: breaker.state,
            took,
        })
        .collect();
    let code = Exit::combined(rows.iter().map(|row| match &row.result {
        Ok(()) => Exit::Ok,
        Err(error) => Exit::of(error),
    }));
    if out.json {
        out.json(&json!({
            "members": rows.iter().map(|row| json!({
                "member": row.member,
                "state": state(&row.result),
                "breaker": row.breaker,
                "code": row.result.as_ref().err().map(SendError::code),
                "category": row.result.as_ref().err().map(|e| e.category().as_str()),
                "answer": answer(&row.result),
                "millis": row.took.as_millis() as u64,
            })).collect::<Vec<Value>>(),
            "exit_code": code as u8,
        }));
        return Ok(code);
    }
    out.table(
        &["member", "state", "breaker", "answer", "time"],
        rows.iter()
            .map(|row| {
                vec![
                    row.member.clone(),
                    state(&row.result).to_owned(),
                    row.breaker.clone(),
                    answer(&row.result),
                    crate::output::human_duration(row.took),
                ]
            })
            .collect(),
    );
    Ok(code)
}

/// One word for a check's outcome.
pub fn state(result: &Result<(), SendError>) -> &'static str {
    let Err(error) = result else { return "ok" };
    match error.category() {
        Category::Timeout => "timeout",
        Category::Network | Category::ServerError | Category::ServiceUnavailable => "down",
        Category::Authentication => "auth-refused",
        Category::Configuration => "misconfigured",
        Category::RateLimited => "rate-limited",
        Category::Rejected | Category::InvalidMessage => "refused",
        _ => "failed",
    }
}

fn answer(result: &Result<(), SendError>) -> String {
    match result {
        Ok(()) => "reachable".to_owned(),
        Err(error) => format!("{}: {}", error.code(), error.message()),
    }
}

#[cfg(test)]
mod tests {
    use mail_breaker::{Category, SendError};

    use super::{answer, state};

    #[test]
    fn each_failed_check_is_one_word_for_its_kind_of_failure() {
        let cases = [
            (Category::Timeout, "timeout"),
            (Category::Network, "down"),
            (Category::ServerError, "down"),
            (Category::ServiceUnavailable, "down"),
            (Category::Authentication, "auth-refused"),
            (Category::Configuration, "misconfigured"),
            (Category::RateLimited, "rate-limited"),
            (Category::Rejected, "refused"),
            (Category::InvalidMessage, "refused"),
            (Category::Unsupported, "failed"),
        ];
        for (category, word) in cases {
            let failed = Err(SendError::new(category, "test", "test"));
            assert_eq!(state(&failed), word, "{category:?}");
        }
        assert_eq!(state(&Ok(())), "ok");
    }

    #[test]
    fn a_checks_answer_is_reachable_or_the_errors_code_and_message() {
        assert_eq!(answer(&Ok(())), "reachable");
        let refused = Err(SendError::new(
            Category::Authentication,
            "smtp.535",
            "5.7.8 credentials refused",
        ));
        assert_eq!(answer(&refused), "smtp.535: 5.7.8 credentials refused");
    }
}
