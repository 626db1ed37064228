//! The webhook receivers a configuration names (`webhooks.*`), read and checked as every
//! other setting is; and [`MailerEvents`], the sink they keep events in: the mailer's
//! suppression list and its members' reputation breakers.
//!
//! | key | what |
//! |---|---|
//! | `webhooks.body_limit` | the largest body a route reads, in bytes (1024 to 67108864; default 1048576) |
//! | `webhooks.ses.topics` | the SNS topics' ARNs whose messages are read and whose subscriptions are confirmed (a list, or text separated by commas) |
//! | `webhooks.postmark.user`, `webhooks.postmark.password` | the basic credentials Postmark sends (a password of at least 12 characters) |
//! | `webhooks.sendgrid.public_key` | SendGrid's verification key, base64 DER |
//! | `webhooks.mailgun.signing_key` | Mailgun's webhook signing key |
//! | `webhooks.resend.secret` | the endpoint's Svix signing secret, `whsec_...` |
//! | `webhooks.PROVIDER.member` | the member whose events these are (its `name`); default: the one member of that provider (`ses://`, `postmark://`...), if there is exactly one |

use super::ConfigError;
use super::provider::{Api, Provider, Secret};
use super::read::Node;
use super::tree::MemberConfig;

/// The smallest body limit: below it no provider's report fits.
const SMALLEST_BODY_LIMIT: u64 = 1024;
/// The largest body limit: a bound is the point (64 MiB).
const LARGEST_BODY_LIMIT: u64 = 64 * 1024 * 1024;
/// The shortest Postmark password: the route's only authentication.
const SHORTEST_PASSWORD: usize = 12;

/// The receivers as configured, their secrets as `***` in `Debug`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WebhooksConfig {
    pub body_limit: Option<usize>,
    pub ses: Option<Hook<Vec<String>>>,
    pub postmark: Option<Hook<(Secret, Secret)>>,
    pub sendgrid: Option<Hook<Secret>>,
    pub mailgun: Option<Hook<Secret>>,
    pub resend: Option<Hook<Secret>>,
}

/// One provider's receiver: what it verifies with, and the member its events are about.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hook<T> {
    pub secret: T,
    pub member: Option<String>,
}

/// The providers, as their keys name them.
const PROVIDERS: [&str; 5] = ["ses", "postmark", "sendgrid", "mailgun", "resend"];

/// Reads the `webhooks` table. Without the `webhooks` feature it is refused.
pub(crate) fn read(node: &Node<'_>) -> Result<WebhooksConfig, ConfigError> {
    if !cfg!(feature = "webhooks") {
        return Err(node.error(
            "webhook receivers need the crate's `webhooks` feature, which this build does not \
             have",
        ));
    }
    let mut fields = node.table()?;
    let config = WebhooksConfig {
        body_limit: fields.read("body_limit", |node| {
            let bytes = node.whole(SMALLEST_BODY_LIMIT, LARGEST_BODY_LIMIT)?;
            Ok(usize::try_from(bytes).unwrap_or(usize::MAX))
        })?,
        ses: fields.read("ses", |node| hook(node, "topics", topics))?,
        postmark: fields.read("postmark", postmark)?,
        sendgrid: fields.read("sendgrid", |node| hook(node, "public_key", sendgrid_key))?,
        mailgun: fields.read("mailgun", |node| hook(node, "signing_key", mailgun_key))?,
        resend: fields.read("resend", |node| hook(node, "secret", svix_secret))?,
    };
    fields.finish()?;
    if config.providers().next().is_none() {
        return Err(node.error(format!(
            "names no provider to receive events from: give one of {}",
            PROVIDERS.join(", ")
        )));
    }
    Ok(config)
}

/// A provider's table: its secret under `key`, read by `secret`, and `member`.
fn hook<T>(
    node: &Node<'_>,
    key: &'static str,
    secret: impl FnOnce(&Node<'_>) -> Result<T, ConfigError>,
) -> Result<Hook<T>, ConfigError> {
    let mut fields = node.table()?;
    let given = fields.get(key);
    let member = fields.read("member", Node::word)?;
    // A misspelt key is named before the one it was meant to be is missed.
    fields.finish()?;
    let secret = secret(&given.ok_or_else(|| required(node, key))?)?;
    Ok(Hook { secret, member })
}

fn postmark(node: &Node<'_>) -> Result<Hook<(Secret, Secret)>, ConfigError> {
    let mut fields = node.table()?;
    let user_node = fields.get("user");
    let password_node = fields.get("password");
    let member = fields.read("member", Node::word)?;
    fields.finish()?;
    let user_node = user_node.ok_or_else(|| required(node, "user"))?;
    let password_node = password_node.ok_or_else(|| required(node, "password"))?;
    let user = user_node.secret_text()?;
    if user.is_empty() || user.contains(':') {
        // Basic credentials are `user:password`: a `:` in the user would move the split.
        return Err(user_node.error("must be a user name without ':'"));
    }
    let password = password_node.secret_text()?;
    if password.chars().count() < SHORTEST_PASSWORD {
        return Err(password_node.error(format!(
            "must be at least {SHORTEST_PASSWORD} characters: it is all that authenticates \
             Postmark's requests"
        )));
    }
    Ok(Hook {
        secret: (Secret(user), Secret(password)),
        member,
    })
}

/// `key` of the table at `node` is missing.
fn required(node: &Node<'_>, key: &str) -> ConfigError {
    ConfigError::new(format!("{}.{key}", node.path()), "is required")
}

/// SNS topics' ARNs: `arn:PARTITION:sns:REGION:ACCOUNT:NAME`, at least one.
fn topics(node: &Node<'_>) -> Result<Vec<String>, ConfigError> {
    let topics = node.urls()?;
    if topics.is_empty() {
        return Err(node.error("needs at least one topic's ARN"));
    }
    for topic in &topics {
        let parts: Vec<&str> = topic.split(':').collect();
        let arn = parts.len() == 6
            && parts[0] == "arn"
            && parts[2] == "sns"
            && parts.iter().all(|part| !part.is_empty());
        if !arn {
            return Err(node.error(
                "expected SNS topics' ARNs, such as arn:aws:sns:us-east-1:123456789012:ses-events",
            ));
        }
    }
    Ok(topics)
}

/// The secret text at `node`, not empty; an error never shows it.
fn non_empty_secret(node: &Node<'_>) -> Result<String, ConfigError> {
    let text = node.secret_text()?;
    if text.trim().is_empty() {
        return Err(node.error("must not be empty"));
    }
    Ok(text)
}

fn mailgun_key(node: &Node<'_>) -> Result<Secret, ConfigError> {
    non_empty_secret(node).map(Secret)
}

fn sendgrid_key(node: &Node<'_>) -> Result<Secret, ConfigError> {
    let text = non_empty_secret(node)?;
    #[cfg(feature = "webhooks")]
    crate::webhooks::PublicKey::from_base64(&text)
        .map_err(|error| node.error(error.reason().to_owned()))?;
    Ok(Secret(text))
}

fn svix_secret(node: &Node<'_>) -> Result<Secret, ConfigError> {
    let text = non_empty_secret(node)?;
    #[cfg(feature = "webhooks")]
    crate::webhooks::SvixSecret::new(&text)
        .map_err(|error| node.error(error.reason().to_owned()))?;
    Ok(Secret(text))
}

/// The members of a provider, as the receivers' keys name them: `ses://` is `ses`, an API's
/// URL its name; an SMTP member is none of them.
fn kind(member: &MemberConfig) -> Option<&'static str> {
    match &member.provider {
        Provider::Ses { .. } => Some("ses"),
        Provider::Api { api, .. } => Some(match api {
            Api::Postmark => "postmark",
            Api::Resend => "resend",
            Api::SendGrid => "sendgrid",
            Api::Mailgun => "mailgun",
        }),
        Provider::Smtp { .. } | Provider::Graph { .. } => None,
    }
}

impl WebhooksConfig {
    /// The providers given, with the member each names.
    fn providers(&self) -> impl Iterator<Item = (&'static str, Option<&str>)> {
        [
            ("ses", self.ses.as_ref().map(|hook| hook.member.as_deref())),
            (
                "postmark",
                self.postmark.as_ref().map(|hook| hook.member.as_deref()),
            ),
            (
                "sendgrid",
                self.sendgrid.as_ref().map(|hook| hook.member.as_deref()),
            ),
            (
                "mailgun",
                self.mailgun.as_ref().map(|hook| hook.member.as_deref()),
            ),
            (
                "resend",
                self.resend.as_ref().map(|hook| hook.member.as_deref()),
            ),
        ]
        .into_iter()
        .filter_map(|(provider, given)| given.map(|member| (provider, member)))
    }

    /// Checks the receivers against the stack: events need somewhere to be kept, and a
    /// provider without a member named must have at most one member of its kind.
    pub(crate) fn check(
        &self,
        members: &[MemberConfig],
        suppression: bool,
    ) -> Result<(), ConfigError> {
        let breakers = members.iter().any(|member| member.reputation.is_some());
        if !suppression && !breakers {
            return Err(ConfigError::new(
                "webhooks",
                "the receivers keep events in the suppression list or in members' reputation \
                 breakers, and the stack has neither: add suppression=true, or a member's \
                 reputation.*",
            ));
        }
        for (provider, member) in self.providers() {
            let of_kind = members
                .iter()
                .filter(|member| kind(member) == Some(provider))
                .count();
            if member.is_none() && of_kind > 1 {
                return Err(ConfigError::new(
                    format!("webhooks.{provider}.member"),
                    format!(
                        "the stack has {of_kind} {provider} members: name the one whose events \
                         these are"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The member each provider's events are about, by name: the one named, else the one
    /// member of its kind; `names` are the members' names in the configuration's order. A
    /// member named that the stack does not have is an error naming the key.
    #[cfg(feature = "webhooks")]
    pub(crate) fn members(
        &self,
        members: &[MemberConfig],
        names: &[&str],
    ) -> Result<Vec<(&'static str, String)>, ConfigError> {
        let mut found = Vec::new();
        for (provider, member) in self.providers() {
            match member {
                Some(name) if names.contains(&name) => found.push((provider, name.to_owned())),
                Some(name) => {
                    let cut: String = name.chars().take(40).collect();
                    return Err(ConfigError::new(
                        format!("webhooks.{provider}.member"),
                        format!(
                            "no member is named {cut:?}; the members are {}",
                            names.join(", ")
                        ),
                    ));
                }
                None => {
                    let mut of_kind = members
                        .iter()
                        .zip(names)
                        .filter(|(member, _)| kind(member) == Some(provider));
                    if let (Some((_, name)), None) = (of_kind.next(), of_kind.next()) {
                        found.push((provider, (*name).to_owned()));
                    }
                }
            }
        }
        Ok(found)
    }
}

/// The receivers built from a configuration, ready to be handed a sink: cloned into a new
/// [`Webhooks`](crate::webhooks::Webhooks) each time one is asked for.
#[cfg(feature = "webhooks")]
#[derive(Clone)]
pub(crate) struct Receivers {
    body_limit: Option<usize>,
    ses: Option<crate::webhooks::SnsPolicy>,
    postmark: Option<crate::webhooks::BasicAuth>,
    sendgrid: Option<crate::webhooks::PublicKey>,
    mailgun: Option<crate::webhooks::SigningKey>,
    resend: Option<crate::webhooks::SvixSecret>,
    members: Vec<(crate::events::Provider, String)>,
}

#[cfg(feature = "webhooks")]
impl Receivers {
    /// The receivers `config` names, for the members named `names` (in the configuration's
    /// order).
    pub(crate) fn new(
        config: &WebhooksConfig,
        members: &[MemberConfig],
        names: &[&str],
    ) -> Result<Receivers, ConfigError> {
        use crate::events::Provider as Reporter;
        use crate::webhooks::{BasicAuth, PublicKey, SigningKey, SnsPolicy, SvixSecret};
        let within = |key: &'static str| {
            move |error: ConfigError| ConfigError::new(key, error.reason().to_owned())
        };
        let members = config
            .members(members, names)?
            .into_iter()
            .filter_map(|(provider, name)| {
                let reporter = match provider {
                    "ses" => Reporter::Ses,
                    "postmark" => Reporter::Postmark,
                    "sendgrid" => Reporter::SendGrid,
                    "mailgun" => Reporter::Mailgun,
                    "resend" => Reporter::Resend,
                    _ => return None,
                };
                Some((reporter, name))
            })
            .collect();
        Ok(Receivers {
            body_limit: config.body_limit,
            ses: config.ses.as_ref().map(|hook| {
                hook.secret
                    .iter()
                    .fold(SnsPolicy::new(), |policy, topic| policy.allow_topic(topic))
            }),
            postmark: config.postmark.as_ref().map(|hook| {
                let (user, password) = &hook.secret;
                BasicAuth::new(&user.0, &password.0)
            }),
            sendgrid: config
                .sendgrid
                .as_ref()
                .map(|hook| PublicKey::from_base64(&hook.secret.0))
                .transpose()
                .map_err(within("webhooks.sendgrid.public_key"))?,
            mailgun: config
                .mailgun
                .as_ref()
                .map(|hook| SigningKey::new(hook.secret.0.clone())),
            resend: config
                .resend
                .as_ref()
                .map(|hook| SvixSecret::new(&hook.secret.0))
                .transpose()
                .map_err(within("webhooks.resend.secret"))?,
            members,
        })
    }

    /// Receivers keeping what they verify in `sink`.
    pub(crate) fn webhooks(
        &self,
        sink: std::sync::Arc<dyn crate::events::EventSink>,
    ) -> crate::webhooks::Webhooks {
        let mut webhooks = crate::webhooks::Webhooks::new(sink);
        if let Some(bytes) = self.body_limit {
            webhooks = webhooks.body_limit(bytes);
        }
        if let Some(policy) = &self.ses {
            webhooks = webhooks.ses(policy.clone());
        }
        if let Some(credentials) = &self.postmark {
            webhooks = webhooks.postmark(credentials.clone());
        }
        if let Some(key) = &self.sendgrid {
            webhooks = webhooks.sendgrid(key.clone());
        }
        if let Some(key) = &self.mailgun {
            webhooks = webhooks.mailgun(key.clone());
        }
        if let Some(secret) = &self.resend {
            webhooks = webhooks.resend(secret.clone());
        }
        for (provider, member) in &self.members {
            webhooks = webhooks.member(*provider, member.clone());
        }
        webhooks
    }
}

/// The sink a [`Mailer`](super::Mailer)'s receivers keep events in: its suppression list and
/// its members' reputation breakers, each fed every event.
///
/// Each of them keeps an event's `(provider, event id, recipient)` once, in the same
/// transaction as what the event changes: a provider resending a report changes nothing in
/// either. When one of them fails, [`keep`](crate::events::EventSink::keep) fails, the
/// receiver answers 5xx and the provider sends the report again; the one that had kept it
/// then counts it as already kept, the other keeps it.
///
/// [`Kept::new`](crate::events::Kept::new) is the larger of the list's count and the
/// breakers' (each event is about one member, so the breakers count it at most once).
///
/// Cheap to clone: clones share the list's and the breakers' stores.
///
/// # Example
/// ```
/// use std::time::SystemTime;
/// use mail_breaker::Mailer;
/// use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = tempfile::tempdir().unwrap();
/// let dsn = format!(
///     "smtp://127.0.0.1:2525?name=relay&reputation.failover=false\
///      &outbox=sqlite://{}/outbox.db&suppression=true",
///     dir.path().display()
/// );
/// let mailer = Mailer::from_dsn(&dsn)?.build().await?;
/// let sink = mailer.event_sink().expect("a suppression list and a reputation breaker");
/// let mut bounce = DeliveryEvent::new(
///     Provider::Ses,
///     "sns-message-1",
///     EventKind::Bounced { bounce: BounceKind::Permanent, subtype: None },
///     "gone@example.org",
///     SystemTime::now(),
/// );
/// bounce.member = Some("relay".into());
/// assert_eq!(sink.keep(&[bounce.clone()]).await?.new, 1);
/// assert_eq!(sink.keep(&[bounce]).await?.new, 0, "a resent report changes nothing");
/// assert!(mailer.suppression().unwrap().contains("gone@example.org").await?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[cfg(feature = "webhooks")]
#[derive(Clone)]
pub struct MailerEvents {
    list: Option<crate::suppression::SuppressionList>,
    breakers: Vec<crate::reputation::ReputationBreaker>,
}

#[cfg(feature = "webhooks")]
impl std::fmt::Debug for MailerEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailerEvents")
            .field("list", &self.list)
            .field(
                "breakers",
                &self
                    .breakers
                    .iter()
                    .map(crate::reputation::ReputationBreaker::member)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[cfg(feature = "webhooks")]
impl MailerEvents {
    /// A sink feeding `list` (if any) and `breakers`; `None` when there is nothing to feed.
    pub(crate) fn new(
        list: Option<crate::suppression::SuppressionList>,
        breakers: Vec<crate::reputation::ReputationBreaker>,
    ) -> Option<MailerEvents> {
        (list.is_some() || !breakers.is_empty()).then_some(MailerEvents { list, breakers })
    }
}

#[cfg(feature = "webhooks")]
#[async_trait::async_trait]
impl crate::events::EventSink for MailerEvents {
    async fn keep(
        &self,
        events: &[crate::events::DeliveryEvent],
    ) -> Result<crate::events::Kept, crate::events::KeepError> {
        let listed = match &self.list {
            Some(list) => list.keep(events).await?.new,
            None => 0,
        };
        let mut counted = 0;
        for breaker in &self.breakers {
            counted += breaker.record(events).await?.new;
        }
        Ok(crate::events::Kept {
            new: listed.max(counted),
        })
    }
}

#[cfg(all(test, feature = "webhooks"))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::SystemTime;

    use async_trait::async_trait;

    use super::MailerEvents;
    use crate::events::{BounceKind, DeliveryEvent, EventKind, EventSink, KeepError, Provider};
    use crate::reputation::{
        Heard, MemoryReputation, Recorded, ReputationBreaker, ReputationRules, ReputationStore,
        Standing, TierChange,
    };
    use crate::suppression::SuppressionList;

    /// A memory store that fails every call while `failing` is set (Redis away).
    #[derive(Debug, Default)]
    struct Flaky {
        inner: MemoryReputation,
        failing: AtomicBool,
    }

    impl Flaky {
        fn check(&self) -> Result<(), KeepError> {
            if self.failing.load(Ordering::SeqCst) {
                return Err(KeepError::new("the test's store is away"));
            }
            Ok(())
        }
    }

    #[async_trait]
    impl ReputationStore for Flaky {
        async fn record(
            &self,
            member: &str,
            rules: &ReputationRules,
            sends: u64,
            heard: &[Heard],
        ) -> Result<Recorded, KeepError> {
            self.check()?;
            self.inner.record(member, rules, sends, heard).await
        }

        async fn standing(
            &self,
            member: &str,
            rules: &ReputationRules,
        ) -> Result<Standing, KeepError> {
            self.check()?;
            self.inner.standing(member, rules).await
        }

        async fn reset(
            &self,
            member: &str,
            rules: &ReputationRules,
        ) -> Result<TierChange, KeepError> {
            self.check()?;
            self.inner.reset(member, rules).await
        }
    }

    fn bounce(id: &str, to: &str) -> DeliveryEvent {
        let mut event = DeliveryEvent::new(
            Provider::Ses,
            id,
            EventKind::Bounced {
                bounce: BounceKind::Permanent,
                subtype: None,
            },
            to,
            SystemTime::now(),
        );
        event.member = Some("ses".into());
        event
    }

    #[tokio::test]
    async fn a_breaker_that_cannot_keep_an_event_fails_the_keep_and_the_resent_event_counts_once_in_each()
     {
        let dir = tempfile::tempdir().unwrap();
        let outbox = crate::outbox::Outbox::sqlite(dir.path().join("outbox.db"))
            .await
            .unwrap();
        let list = SuppressionList::in_outbox(&outbox).unwrap();
        let store = Arc::new(Flaky::default());
        let breaker = ReputationBreaker::builder("ses")
            .store(Arc::clone(&store) as Arc<dyn ReputationStore>)
            .build()
            .unwrap();
        let sink = MailerEvents::new(Some(list.clone()), vec![breaker.clone()]).unwrap();
        let event = bounce("sns-1", "gone@example.org");
        store.failing.store(true, Ordering::SeqCst);
        assert!(
            sink.keep(std::slice::from_ref(&event)).await.is_err(),
            "the provider is answered 5xx and sends it again"
        );
        assert!(list.contains("gone@example.org").await.unwrap());
        store.failing.store(false, Ordering::SeqCst);
        assert_eq!(
            sink.keep(std::slice::from_ref(&event)).await.unwrap().new,
            1,
            "new to the breaker"
        );
        assert_eq!(sink.keep(&[event]).await.unwrap().new, 0, "new to none");
        let standing = breaker.standing().await.unwrap();
        assert_eq!(standing.window.hard_bounces, 1);
    }

    #[tokio::test]
    async fn new_counts_the_events_the_list_or_the_breakers_had_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = crate::outbox::Outbox::sqlite(dir.path().join("outbox.db"))
            .await
            .unwrap();
        let list = SuppressionList::in_outbox(&outbox).unwrap();
        let breaker = ReputationBreaker::builder("ses").build().unwrap();
        let other = ReputationBreaker::builder("postmark").build().unwrap();
        let sink = MailerEvents::new(Some(list), vec![breaker, other]).unwrap();
        let events = [
            bounce("sns-2", "a@example.org"),
            bounce("sns-3", "b@example.org"),
        ];
        assert_eq!(sink.keep(&events).await.unwrap().new, 2);
        let only_breakers = MailerEvents::new(
            None,
            vec![ReputationBreaker::builder("ses").build().unwrap()],
        )
        .unwrap();
        assert_eq!(only_breakers.keep(&events).await.unwrap().new, 2);
        assert!(MailerEvents::new(None, Vec::new()).is_none());
    }
}
