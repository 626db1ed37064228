//! Exit codes by what happened (DESIGN §17), and the failure a command ends with.

use mail_breaker::{Category, ConfigError, SendError};

/// The process's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Delivered or queued; the command did what it said.
    Ok = 0,
    /// Anything else.
    Other = 1,
    /// Bad configuration or arguments.
    Usage = 2,
    /// Refused: `Rejected`, `InvalidMessage`.
    Refused = 3,
    /// Provider down or timed out.
    Down = 4,
    /// Authentication or configuration at the provider.
    Setup = 5,
    /// Rate limited.
    RateLimited = 6,
}

impl Exit {
    /// The code for a send that ended with `error`. A pool every member of which failed
    /// (`pool.exhausted`) takes the [decisive](Exit::combined) code of its members' failures
    /// (every member refused the credentials: 5; one down beside one refusing: 4).
    pub fn of(error: &SendError) -> Exit {
        let causes = error.causes();
        if causes.is_empty() {
            return Exit::of_category(error.category());
        }
        Exit::combined(causes.iter().map(Exit::of))
    }

    fn of_category(category: Category) -> Exit {
        match category {
            Category::Rejected | Category::InvalidMessage => Exit::Refused,
            Category::Network
            | Category::Timeout
            | Category::ServerError
            | Category::ServiceUnavailable => Exit::Down,
            Category::Authentication | Category::Configuration => Exit::Setup,
            Category::RateLimited => Exit::RateLimited,
            _ => Exit::Other,
        }
    }

    /// The code for several outcomes: `Ok` when all were, else the decisive failure's. First
    /// what may still go if tried again (down: 4, then rate limited: 6), since a temporary
    /// refusal beside a permanent one means the job is not over; then what an operator must
    /// fix before anything goes (the provider's setup: 5, the command's input: 2); then a
    /// refusal (3), which no retry changes; then anything else (1).
    pub fn combined(codes: impl IntoIterator<Item = Exit>) -> Exit {
        codes
            .into_iter()
            .max_by_key(|code| code.weight())
            .unwrap_or(Exit::Ok)
    }

    /// How decisive a code is among others: the larger, the more (see [`combined`](Exit::combined)).
    fn weight(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Other => 1,
            Exit::Refused => 2,
            Exit::Usage => 3,
            Exit::Setup => 4,
            Exit::RateLimited => 5,
            Exit::Down => 6,
        }
    }
}

/// What ends a command early: its exit code and what to tell the person.
#[derive(Debug)]
pub struct Failure {
    pub code: Exit,
    pub message: String,
    /// The setting at fault, for a configuration error.
    pub setting: Option<String>,
}

impl Failure {
    pub fn new(code: Exit, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            setting: None,
        }
    }

    /// Bad arguments or configuration: exit 2.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(Exit::Usage, message)
    }

    /// A send-side error (reading the outbox, say), with the code its category gives.
    pub fn send(doing: &str, error: &SendError) -> Failure {
        Failure::new(Exit::of(error), format!("{doing}: {error}"))
    }
}

impl From<ConfigError> for Failure {
    fn from(error: ConfigError) -> Failure {
        Failure {
            code: Exit::Usage,
            message: format!("bad configuration: {error}"),
            setting: Some(error.setting().to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use mail_breaker::{Category, SendError};

    use super::Exit;

    fn error(category: Category) -> SendError {
        SendError::new(category, "test", "test")
    }

    #[test]
    fn a_pool_whose_members_all_failed_alike_exits_with_their_code() {
        let exhausted = error(Category::ServiceUnavailable).with_causes(vec![
            error(Category::Authentication),
            error(Category::Configuration),
        ]);
        assert_eq!(Exit::of(&exhausted), Exit::Setup);
    }

    #[test]
    fn a_pool_whose_members_failed_differently_exits_with_the_decisive_code() {
        let exhausted = error(Category::ServiceUnavailable).with_causes(vec![
            error(Category::Rejected),
            error(Category::Authentication),
        ]);
        assert_eq!(Exit::of(&exhausted), Exit::Setup);
    }

    #[test]
    fn each_category_exits_with_the_code_its_kind_of_failure_has() {
        let cases = [
            (Category::Rejected, Exit::Refused),
            (Category::InvalidMessage, Exit::Refused),
            (Category::Network, Exit::Down),
            (Category::Timeout, Exit::Down),
            (Category::ServerError, Exit::Down),
            (Category::ServiceUnavailable, Exit::Down),
            (Category::Authentication, Exit::Setup),
            (Category::Configuration, Exit::Setup),
            (Category::RateLimited, Exit::RateLimited),
            (Category::Unsupported, Exit::Other),
        ];
        for (category, exit) in cases {
            assert_eq!(Exit::of(&error(category)), exit, "{category:?}");
        }
    }
    #[test]
    fn a_temporary_failure_beside_a_permanent_one_is_decisive_since_it_may_still_go() {
        assert_eq!(Exit::combined([Exit::Refused, Exit::Down]), Exit::Down);
        assert_eq!(
            Exit::combined([Exit::RateLimited, Exit::Refused]),
            Exit::RateLimited
        );
        let exhausted = error(Category::ServiceUnavailable).with_causes(vec![
            error(Category::Rejected),
            error(Category::RateLimited),
        ]);
        assert_eq!(Exit::of(&exhausted), Exit::RateLimited);
    }

    #[test]
    fn the_decisive_code_is_what_may_still_go_then_what_an_operator_fixes_then_a_refusal() {
        let order = [
            Exit::Down,
            Exit::RateLimited,
            Exit::Setup,
            Exit::Usage,
            Exit::Refused,
            Exit::Other,
        ];
        for (rank, decisive) in order.iter().enumerate() {
            for weaker in &order[rank + 1..] {
                assert_eq!(Exit::combined([*weaker, *decisive, Exit::Ok]), *decisive);
                assert_eq!(Exit::combined([*decisive, *weaker]), *decisive);
            }
        }
        assert_eq!(Exit::combined([Exit::Ok, Exit::Ok]), Exit::Ok);
        assert_eq!(Exit::combined([]), Exit::Ok);
    }
}
