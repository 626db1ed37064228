//! Reading an import's CSV (its format is documented on `SuppressionList::import`): every
//! line read before anything is written, so that a bad line imports nothing.

use super::{Reason, SuppressionError, rules};

/// Column names of the address, compared without case, `_`, `-` or spaces.
const ADDRESS_COLUMNS: [&str; 4] = ["address", "email", "emailaddress", "recipient"];
/// Column names of the reason, compared likewise.
const REASON_COLUMNS: [&str; 3] = ["reason", "suppressionreason", "type"];

/// Column names of a delivery status (SendGrid's `5.1.1`) or reply code (Mailgun's `550`),
/// compared likewise.
const STATUS_COLUMNS: [&str; 2] = ["status", "code"];

/// What an import's CSV holds.
#[derive(Debug)]
pub(super) struct Read {
    /// The addresses (as keys) and reasons to suppress, in the file's order.
    pub(super) rows: Vec<(String, Reason)>,
    /// Rows whose status says a temporary failure (`4.x.x`): no reason to suppress for good.
    pub(super) skipped: usize,
}

/// The addresses (as keys) and reasons of `csv`, in its order; a line without a reason takes
/// `default`.
pub(super) fn read(csv: &str, default: Reason) -> Result<Read, SuppressionError> {
    let mut lines = csv
        .lines()
        .enumerate()
        .map(|(index, line)| (index + 1, line))
        .filter(|(_, line)| !line.trim().is_empty());
    let Some((first_number, first_line)) = lines.next() else {
        return Ok(Read {
            rows: Vec::new(),
            skipped: 0,
        });
    };
    let first = fields(first_line).map_err(|why| error(first_number, why))?;
    let header = first
        .first()
        .is_some_and(|field| ADDRESS_COLUMNS.contains(&squashed(field).as_str()))
        || !first.iter().any(|field| field.contains('@'));
    let (address_at, reason_at, status_at, first_row) = if header {
        let position = |names: &[&str]| {
            first
                .iter()
                .position(|field| names.contains(&squashed(field).as_str()))
        };
        let Some(address_at) = position(&ADDRESS_COLUMNS) else {
            return Err(error(
                first_number,
                "the header names no address column (address, email, email_address, \
                 emailaddress or recipient)"
                    .to_owned(),
            ));
        };
        (
            address_at,
            position(&REASON_COLUMNS),
            position(&STATUS_COLUMNS),
            None,
        )
    } else {
        (0, Some(1), None, Some((first_number, first)))
    };
    let mut rows = Vec::new();
    let mut skipped = 0;
    let mut take = |number: usize, row: Vec<String>| -> Result<(), SuppressionError> {
        let Some(address) = row.get(address_at) else {
            return Err(error(
                number,
                format!("it has no column {}", address_at + 1),
            ));
        };
        let key = rules::address_key(address).map_err(|why| {
            error(
                number,
                format!(
                    "{:?} is no e-mail address: {why}",
                    address.chars().take(80).collect::<String>()
                ),
            )
        })?;
        if status_at
            .and_then(|at| row.get(at))
            .is_some_and(|status| status.trim().starts_with('4'))
        {
            skipped += 1;
            return Ok(());
        }
        if reason_at
            .and_then(|at| row.get(at))
            .is_some_and(|text| says_temporary(text))
        {
            skipped += 1;
            return Ok(());
        }
        let reason = match reason_at.and_then(|at| row.get(at)) {
            // A sentence the list does not read as a reason is a provider's free text (the
            // receiving server's answer in SendGrid's bounces export): the import's reason.
            Some(text) if is_free_text(text) && Reason::from_export(text).is_none() => default,
            Some(text) if !text.trim().is_empty() => {
                Reason::from_export(text).ok_or_else(|| {
                    error(
                        number,
                        format!(
                            "{:?} is no reason the list knows (bounced, complained, manual, \
                             or a provider's HardBounce, SpamComplaint, ManualSuppression)",
                            text.chars().take(80).collect::<String>()
                        ),
                    )
                })?
            }
            _ => default,
        };
        rows.push((key, reason));
        Ok(())
    };
    if let Some((number, row)) = first_row {
        take(number, row)?;
    }
    for (number, line) in lines {
        let row = fields(line).map_err(|why| error(number, why))?;
        take(number, row)?;
    }
    Ok(Read { rows, skipped })
}

/// Whether a reason field is free text (words with spaces between, which
/// [`Reason::from_export`] reads when they spell a reason: `Hard Bounce`) rather than one
/// word: a word the list does not know is refused, as a typo would be.
fn is_free_text(text: &str) -> bool {
    text.split_whitespace().nth(1).is_some()
}

/// Whether a reason field says a temporary failure: it begins with a `4xx` reply or a
/// `4.x.x` status (`421 4.7.0 Try again later`), or, beginning with neither a `5xx` nor a
/// `5.x.x`, it names a soft, transient, temporary or deferred failure (`Soft bounce`,
/// Postmark's `SoftBounce`). A permanent code first wins over such words in the server's
/// text.
fn says_temporary(text: &str) -> bool {
    let first = text.split_whitespace().next().unwrap_or_default();
    let code = |class: char| {
        first.strip_prefix(class).is_some_and(|rest| {
            (rest.len() == 2 && rest.bytes().all(|b| b.is_ascii_digit())) || rest.starts_with('.')
        })
    };
    if code('4') {
        return true;
    }
    if code('5') {
        return false;
    }
    text.split(|c: char| !c.is_alphanumeric()).any(|word| {
        matches!(
            word.to_lowercase().as_str(),
            "soft" | "softbounce" | "transient" | "temporary" | "deferred" | "greylisted"
        )
    })
}

fn error(line: usize, why: String) -> SuppressionError {
    SuppressionError::Import { line, why }
}

/// A column's name as compared: lower case, without `_`, `-`, spaces or a byte-order mark.
fn squashed(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '_' | '-' | ' ' | '\u{feff}'))
        .flat_map(char::to_lowercase)
        .collect()
}

/// The fields of one line: split at commas outside double quotes, `""` a quote inside them.
fn fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.trim_end_matches('\r').chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', true) => quoted = false,
            ('"', false) if field.trim().is_empty() => {
                field.clear();
                quoted = true;
            }
            (',', false) => fields.push(std::mem::take(&mut field).trim().to_owned()),
            (c, _) => field.push(c),
        }
    }
    if quoted {
        return Err("a quoted field is not closed on its line".to_owned());
    }
    fields.push(field.trim().to_owned());
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_header_reads_address_then_an_optional_reason() {
        let rows = read("a@Example.org\nb@example.org,complaint\n\n", Reason::Manual).unwrap();
        assert_eq!(
            rows.rows,
            vec![
                ("a@example.org".to_owned(), Reason::Manual),
                ("b@example.org".to_owned(), Reason::Complained)
            ]
        );
    }

    #[test]
    fn a_header_names_the_columns_and_others_are_ignored() {
        let csv = "address,code,error,created_at\n\"x@example.org\",550,\"no, such user\",2024\n";
        let rows = read(csv, Reason::Bounced).unwrap();
        assert_eq!(
            rows.rows,
            vec![("x@example.org".to_owned(), Reason::Bounced)]
        );
    }

    #[test]
    fn a_providers_free_text_reason_takes_the_imports_reason_and_an_unknown_word_is_refused() {
        // SendGrid's bounces export: the reason is the receiving server's answer.
        let csv = "email,created,reason,status\n\
                   gone@example.org,1700000000,\"550 5.1.1 The email account that you tried to reach does not exist.\",5.1.1\n";
        let rows = read(csv, Reason::Bounced).unwrap();
        assert_eq!(
            rows.rows,
            vec![("gone@example.org".to_owned(), Reason::Bounced)]
        );
        // Two words of free text are a sentence too.
        let rows = read(
            "email,reason\nfull@example.org,Mailbox full\n",
            Reason::Bounced,
        )
        .unwrap();
        assert_eq!(
            rows.rows,
            vec![("full@example.org".to_owned(), Reason::Bounced)]
        );
        let error = read("email,reason\na@example.org,complaind\n", Reason::Bounced).unwrap_err();
        assert!(
            matches!(error, SuppressionError::Import { line: 2, .. }),
            "{error}"
        );
    }

    #[test]
    fn a_row_whose_status_says_a_temporary_failure_is_skipped_not_suppressed() {
        // SendGrid's blocks export: a 4.x.x block is no reason to suppress for good.
        let csv = "email,created,reason,status\n\
                   later@example.org,1700000000,\"421 4.7.0 Try again later\",4.7.0\n\
                   gone@example.org,1700000000,\"550 5.1.1 No such user\",5.1.1\n";
        let read = read(csv, Reason::Bounced).unwrap();
        assert_eq!(
            read.rows,
            vec![("gone@example.org".to_owned(), Reason::Bounced)]
        );
        assert_eq!(read.skipped, 1);
    }

    #[test]
    fn a_row_whose_reason_says_a_temporary_failure_is_skipped_not_suppressed() {
        let csv = "email,reason\n\
                   soft@example.org,Soft bounce\n\
                   soft2@example.org,SoftBounce\n\
                   later@example.org,\"421 4.7.0 Try again later\"\n\
                   status@example.org,\"4.2.2 over quota\"\n\
                   temp@example.org,Temporary failure\n\
                   gone@example.org,\"550 5.1.1 No such user\"\n\
                   fourth@example.org,\"4th notice: address unknown\"\n\
                   many@example.org,\"4000 mailboxes closed\"\n";
        let read = read(csv, Reason::Bounced).unwrap();
        // `4th` and `4000` begin no reply code: their rows are suppressed.
        assert_eq!(
            read.rows,
            vec![
                ("gone@example.org".to_owned(), Reason::Bounced),
                ("fourth@example.org".to_owned(), Reason::Bounced),
                ("many@example.org".to_owned(), Reason::Bounced)
            ]
        );
        assert_eq!(read.skipped, 5);
    }

    #[test]
    fn a_row_whose_code_column_says_a_temporary_failure_is_skipped_not_suppressed() {
        // Mailgun's bounces export: address, code, error, created_at.
        let csv = "address,code,error,created_at\n\
                   later@example.org,421,\"Try again later\",2024\n\
                   gone@example.org,550,\"No such user\",2024\n";
        let read = read(csv, Reason::Bounced).unwrap();
        assert_eq!(
            read.rows,
            vec![("gone@example.org".to_owned(), Reason::Bounced)]
        );
        assert_eq!(read.skipped, 1);
    }

    #[test]
    fn a_bad_line_names_its_number() {
        let error = read(
            "email,reason\na@example.org,bounce\nnot-an-address\n",
            Reason::Manual,
        )
        .unwrap_err();
        assert!(
            matches!(error, SuppressionError::Import { line: 3, .. }),
            "{error}"
        );
        let error = read("a@example.org,later\n", Reason::Manual).unwrap_err();
        assert!(
            matches!(error, SuppressionError::Import { line: 1, .. }),
            "{error}"
        );
    }

    #[test]
    fn an_unclosed_quote_is_an_error_of_its_line() {
        let error = read("\"a@example.org\n", Reason::Manual).unwrap_err();
        assert!(matches!(error, SuppressionError::Import { line: 1, .. }));
    }
}
