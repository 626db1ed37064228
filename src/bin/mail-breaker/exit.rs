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
    /// (`pool.exhausted`) takes its members' code when they all agree (every member refused
    /// the credentials: 5), else "down".
    pub fn of(error: &SendError) -> Exit {
        let causes = error.causes();
        if !causes.is_empty() {
            let first = Exit::of(&causes[0]);
            if causes.iter().all(|cause| Exit::of(cause) == first) {
                return first;
            }
        }
        Exit::of_category(error.category())
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

    /// The code for several outcomes: `Ok` when all were, the one code when every failure
    /// agrees, else `Other`.
    pub fn combined(codes: impl IntoIterator<Item = Exit>) -> Exit {
        let mut failed = codes.into_iter().filter(|code| *code != Exit::Ok);
        let Some(first) = failed.next() else {
            return Exit::Ok;
        };
        if failed.all(|code| code == first) {
            first
        } else {
            Exit::Other
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
    fn a_pool_whose_members_failed_differently_exits_with_its_own_code() {
        let exhausted = error(Category::ServiceUnavailable).with_causes(vec![
            error(Category::Authentication),
            error(Category::Rejected),
        ]);
        assert_eq!(Exit::of(&exhausted), Exit::Down);
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
}
