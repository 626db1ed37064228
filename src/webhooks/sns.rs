//! SNS's message signatures, verified as AWS documents them: the canonical string of the
//! signed fields, RSA PKCS#1 v1.5 with SHA-1 (signature version 1) or SHA-256 (version 2),
//! and the signing certificate fetched from an SNS host only, without redirects, bounded,
//! and cached by its URL.
//!
//! The cheap checks come before the fetch (the type, the version, the topic in the
//! allow-list, the time), so that a request naming a topic nobody allowed makes this process
//! fetch nothing.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rsa::RsaPublicKey;
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::pkcs8::DecodePublicKey;
use rsa::signature::Verifier;
use serde_json::{Map, Value};
use x509_cert::Certificate;
use x509_cert::der::{DecodePem, Encode};

use super::answer::Refused;
use super::timestamp;
use crate::error::ConfigError;

/// How long after its `Timestamp` an SNS message is accepted: the timestamp is the publish
/// time and a resend keeps it, and SNS's default delivery policy for HTTP(S) retries for at
/// most an hour; 5 minutes more for clocks and queues.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(65 * 60);

/// The most bytes read from the certificate URL or the confirmation URL.
const MAX_FETCHED: usize = 64 * 1024;

/// The most certificates kept in the cache; AWS signs with one certificate per region at a
/// time, so a few are ever in use.
const MAX_CACHED: usize = 64;

/// The smallest RSA key accepted, in bytes (2048 bits): SNS's certificates are 2048 bits.
const MIN_KEY_BYTES: usize = 256;

/// What the SNS route accepts: the topics it reads, and how it fetches signing
/// certificates.
///
/// Every message is refused unless its `TopicArn` is allowed (an SNS message is signed by
/// AWS for any AWS account's topic, so the signature alone says nothing about whose topic it
/// is), its `SigningCertURL` is `https` on a host matching
/// `^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$` with no port, query or credentials and a path
/// ending `.pem`, its `Timestamp` is at most an hour and 5 minutes old, and its signature
/// (version 1 or 2) verifies over AWS's canonical string. A `SubscriptionConfirmation` for an
/// allowed topic is confirmed by fetching its `SubscribeURL` (the same host rule, with
/// `Action=ConfirmSubscription` and the same `TopicArn`).
///
/// [`resolve`](Self::resolve) and [`trust_root_pem`](Self::trust_root_pem) point the fetch at
/// another server (a test's, a proxy's) without loosening any of those checks: the URL must
/// still name an SNS host, and the server must still prove that name over TLS.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use mail_breaker::webhooks::SnsPolicy;
///
/// let policy = SnsPolicy::new()
///     .allow_topic("arn:aws:sns:us-east-1:123456789012:ses-bounces")
///     .allow_topic("arn:aws:sns:us-east-1:123456789012:ses-complaints")
///     .fetch_timeout(Duration::from_secs(3));
/// # let _ = policy;
/// ```
#[derive(Clone, Debug)]
pub struct SnsPolicy {
    topics: HashSet<String>,
    overrides: Vec<(String, SocketAddr)>,
    roots: Vec<reqwest::Certificate>,
    fetch_timeout: Duration,
}

impl Default for SnsPolicy {
    fn default() -> SnsPolicy {
        SnsPolicy::new()
    }
}

impl SnsPolicy {
    /// A policy that allows no topic yet, fetching with a 5-second timeout through the
    /// system's DNS and the web's root certificates.
    ///
    /// ```
    /// use mail_breaker::webhooks::SnsPolicy;
    ///
    /// let policy = SnsPolicy::new().allow_topic("arn:aws:sns:eu-west-1:123456789012:events");
    /// # let _ = policy;
    /// ```
    pub fn new() -> SnsPolicy {
        SnsPolicy {
            topics: HashSet::new(),
            overrides: Vec::new(),
            roots: Vec::new(),
            fetch_timeout: Duration::from_secs(5),
        }
    }

    /// Accepts messages from this topic (its whole ARN), and confirms its subscription.
    ///
    /// ```
    /// use mail_breaker::webhooks::SnsPolicy;
    ///
    /// let policy = SnsPolicy::new().allow_topic("arn:aws:sns:us-east-1:123456789012:ses");
    /// # let _ = policy;
    /// ```
    pub fn allow_topic(mut self, topic_arn: impl Into<String>) -> SnsPolicy {
        self.topics.insert(topic_arn.into());
        self
    }

    /// Connects to `addr` for the SNS host `host` instead of asking DNS (a test's loopback
    /// server, a pinned address). The URLs are checked as always: only an SNS host name is
    /// fetched, and the server must present a certificate for that name. A port of `0` means
    /// 443.
    ///
    /// ```
    /// use mail_breaker::webhooks::SnsPolicy;
    ///
    /// let policy = SnsPolicy::new()
    ///     .allow_topic("arn:aws:sns:us-east-1:123456789012:ses")
    ///     .resolve("sns.us-east-1.amazonaws.com", "127.0.0.1:8443".parse().unwrap());
    /// # let _ = policy;
    /// ```
    pub fn resolve(mut self, host: &str, addr: SocketAddr) -> SnsPolicy {
        self.overrides.push((host.to_ascii_lowercase(), addr));
        self
    }

    /// Trusts this root certificate (PEM) for the fetches too, beside the web's roots: a
    /// test's own CA, or a proxy's.
    ///
    /// ```
    /// use mail_breaker::webhooks::SnsPolicy;
    ///
    /// let err = SnsPolicy::new().trust_root_pem(b"not a certificate").unwrap_err();
    /// assert_eq!(err.setting(), "trust_root_pem");
    /// ```
    pub fn trust_root_pem(mut self, pem: &[u8]) -> Result<SnsPolicy, ConfigError> {
        let certificate = reqwest::Certificate::from_pem(pem)
            .map_err(|error| ConfigError::new("trust_root_pem", error.to_string()))?;
        // reqwest reads a PEM without a certificate as valid: check there is one.
        if !String::from_utf8_lossy(pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(ConfigError::new(
                "trust_root_pem",
                "no PEM certificate found",
            ));
        }
        self.roots.push(certificate);
        Ok(self)
    }

    /// How long fetching a certificate or a confirmation URL may take (default 5 seconds).
    ///
    /// ```
    /// use std::time::Duration;
    /// use mail_breaker::webhooks::SnsPolicy;
    ///
    /// let policy = SnsPolicy::new().fetch_timeout(Duration::from_secs(2));
    /// # let _ = policy;
    /// ```
    pub fn fetch_timeout(mut self, timeout: Duration) -> SnsPolicy {
        self.fetch_timeout = timeout;
        self
    }

    fn client(&self) -> Result<reqwest::Client, reqwest::Error> {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .https_only(true)
            .timeout(self.fetch_timeout)
            .connect_timeout(self.fetch_timeout)
            .user_agent(concat!(
                "mail-breaker/",
                env!("CARGO_PKG_VERSION"),
                " sns-webhook"
            ));
        for (host, addr) in &self.overrides {
            builder = builder.resolve(host, *addr);
        }
        for root in &self.roots {
            builder = builder.add_root_certificate(root.clone());
        }
        builder.build()
    }
}

/// The SNS message types this receiver reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MessageType {
    Notification,
    SubscriptionConfirmation,
    UnsubscribeConfirmation,
}

/// A message whose signature verified: only then are its fields read.
#[derive(Debug, Clone)]
pub(crate) struct Verified {
    pub(crate) kind: MessageType,
    pub(crate) message_id: String,
    pub(crate) topic_arn: String,
    pub(crate) message: String,
    pub(crate) timestamp: SystemTime,
    subscribe_url: Option<String>,
}

/// The fields each message type signs, in the canonical string's order; `Subject` only
/// when the message has one.
const NOTIFICATION_FIELDS: &[&str] = &[
    "Message",
    "MessageId",
    "Subject",
    "Timestamp",
    "TopicArn",
    "Type",
];
const CONFIRMATION_FIELDS: &[&str] = &[
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
];

/// The signature's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    Sha1,
    Sha256,
}

/// A certificate's key, kept with the end of its validity.
#[derive(Debug, Clone)]
struct CachedKey {
    key: RsaPublicKey,
    not_after: SystemTime,
}

/// The policy with its HTTP client and its cache of certificates by URL.
pub(crate) struct SnsVerifier {
    topics: HashSet<String>,
    client: Result<reqwest::Client, String>,
    cache: Mutex<CertificateCache>,
}

impl SnsVerifier {
    pub(crate) fn new(policy: SnsPolicy) -> SnsVerifier {
        let client = policy.client().map_err(|error| error.to_string());
        if let Err(error) = &client {
            tracing::error!(%error, "the SNS certificate fetcher could not be built; every SNS message will be refused");
        }
        SnsVerifier {
            topics: policy.topics,
            client,
            cache: Mutex::new(CertificateCache::default()),
        }
    }

    /// Verifies a message's signature and its policy, then gives its fields.
    pub(crate) async fn verify(&self, body: &[u8], now: SystemTime) -> Result<Verified, Refused> {
        let envelope: Map<String, Value> =
            serde_json::from_slice(body).map_err(|_| Refused::Malformed("an SNS message"))?;
        let field = |name: &'static str| -> Result<&str, Refused> {
            envelope
                .get(name)
                .and_then(Value::as_str)
                .ok_or(Refused::Missing(name))
        };
        let kind = match field("Type")? {
            "Notification" => MessageType::Notification,
            "SubscriptionConfirmation" => MessageType::SubscriptionConfirmation,
            "UnsubscribeConfirmation" => MessageType::UnsubscribeConfirmation,
            _ => return Err(Refused::Unsupported("SNS message type")),
        };
        let version = match field("SignatureVersion")? {
            "1" => Version::Sha1,
            "2" => Version::Sha256,
            _ => return Err(Refused::Unsupported("SNS signature version")),
        };
        let topic_arn = field("TopicArn")?;
        if !self.topics.contains(topic_arn) {
            return Err(Refused::Topic);
        }
        let signed_at =
            timestamp::rfc3339(field("Timestamp")?).ok_or(Refused::Missing("Timestamp"))?;
        if !timestamp::within(signed_at, now, MAX_AGE) {
            return Err(Refused::Stale);
        }
        let certificate_url = field("SigningCertURL")?;
        if !is_sns_certificate_url(certificate_url) {
            return Err(Refused::CertificateUrl);
        }
        let signature = STANDARD
            .decode(field("Signature")?)
            .map_err(|_| Refused::Missing("Signature"))?;
        let fields = match kind {
            MessageType::Notification => NOTIFICATION_FIELDS,
            _ => CONFIRMATION_FIELDS,
        };
        let canonical = canonical_string(&envelope, fields)?;
        let key = self.key(certificate_url, now).await?;
        verify_signature(&key, version, canonical.as_bytes(), &signature)?;
        Ok(Verified {
            kind,
            message_id: field("MessageId")?.to_owned(),
            topic_arn: topic_arn.to_owned(),
            message: field("Message")?.to_owned(),
            timestamp: signed_at,
            subscribe_url: envelope
                .get("SubscribeURL")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    /// Confirms a verified subscription by fetching its `SubscribeURL`, which must be an
    /// SNS confirmation URL for the same topic.
    pub(crate) async fn confirm(&self, verified: &Verified) -> Result<(), Refused> {
        let url = verified
            .subscribe_url
            .as_deref()
            .ok_or(Refused::Missing("SubscribeURL"))?;
        if !is_sns_confirmation_url(url, &verified.topic_arn) {
            return Err(Refused::SubscribeUrl);
        }
        let client = self.client.as_ref().map_err(|_| Refused::Certificate)?;
        let response = client.get(url).send().await.map_err(|error| {
            tracing::warn!(%error, "the SNS subscription could not be confirmed");
            Refused::SubscribeUrl
        })?;
        let status = response.status();
        let _ = read_bounded(response).await;
        if status == reqwest::StatusCode::OK {
            tracing::info!(topic = %verified.topic_arn, "SNS subscription confirmed");
            Ok(())
        } else {
            tracing::warn!(%status, "SNS answered the subscription's confirmation with an error");
            Err(Refused::SubscribeUrl)
        }
    }

    /// The key of the certificate at `url`, from the cache or fetched.
    async fn key(&self, url: &str, now: SystemTime) -> Result<RsaPublicKey, Refused> {
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(url, now);
        if let Some(key) = cached {
            return Ok(key);
        }
        let client = self
            .client
            .as_ref()
            .map_err(|_| Refused::CertificateUnavailable)?;
        // Not reaching AWS says nothing of the message: answered 5xx, SNS sends it again.
        let response = client.get(url).send().await.map_err(|error| {
            tracing::warn!(%error, url, "the SNS signing certificate could not be fetched");
            Refused::CertificateUnavailable
        })?;
        if response.status().is_server_error() {
            tracing::warn!(status = %response.status(), url, "AWS failed to serve the SNS signing certificate");
            return Err(Refused::CertificateUnavailable);
        }
        if response.status() != reqwest::StatusCode::OK {
            // A redirect is refused as any other answer: the certificate is where the URL says.
            tracing::warn!(status = %response.status(), url, "the SNS signing certificate was not served");
            return Err(Refused::Certificate);
        }
        let pem = read_bounded(response).await.ok_or(Refused::Certificate)?;
        let cached = read_certificate(&pem, now).ok_or(Refused::Certificate)?;
        let key = cached.key.clone();
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(url, cached, now);
        Ok(key)
    }
}

/// The certificates' keys by URL, at most [`MAX_CACHED`]: when full, the expired ones go
/// first, and all of them when none has expired (AWS uses a few; more means someone is
/// naming many certificate URLs, and fetching again is the price).
#[derive(Debug, Default)]
struct CertificateCache {
    keys: HashMap<String, CachedKey>,
}

impl CertificateCache {
    /// The key of `url`, while its certificate is valid.
    fn get(&self, url: &str, now: SystemTime) -> Option<RsaPublicKey> {
        self.keys
            .get(url)
            .filter(|cached| now <= cached.not_after)
            .map(|cached| cached.key.clone())
    }

    fn insert(&mut self, url: &str, cached: CachedKey, now: SystemTime) {
        if self.keys.len() >= MAX_CACHED {
            self.keys.retain(|_, cached| now <= cached.not_after);
            if self.keys.len() >= MAX_CACHED {
                self.keys.clear();
            }
        }
        self.keys.insert(url.to_owned(), cached);
    }
}

/// The body of `response`, or `None` past [`MAX_FETCHED`] bytes or on an error.
async fn read_bounded(mut response: reqwest::Response) -> Option<Vec<u8>> {
    // The declared length only refuses early; the chunks are counted whatever it says.
    if response
        .content_length()
        .is_some_and(|length| !fits(usize::try_from(length).unwrap_or(usize::MAX)))
    {
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if !fits(body.len().saturating_add(chunk.len())) {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body)
}

/// Whether a fetched body of `length` bytes is within [`MAX_FETCHED`].
fn fits(length: usize) -> bool {
    length <= MAX_FETCHED
}

/// The RSA key of a PEM certificate valid now, of at least 2048 bits.
fn read_certificate(pem: &[u8], now: SystemTime) -> Option<CachedKey> {
    let certificate = Certificate::from_pem(pem).ok()?;
    let validity = &certificate.tbs_certificate.validity;
    let not_after = validity.not_after.to_system_time();
    if now < validity.not_before.to_system_time() || now > not_after {
        return None;
    }
    let der = certificate
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .ok()?;
    let key = RsaPublicKey::from_public_key_der(&der).ok()?;
    if rsa::traits::PublicKeyParts::size(&key) < MIN_KEY_BYTES {
        return None;
    }
    Some(CachedKey { key, not_after })
}

/// AWS's canonical string: each signed field present as `name\nvalue\n`, in order. Every
/// field but `Subject` is required.
fn canonical_string(
    envelope: &Map<String, Value>,
    fields: &[&'static str],
) -> Result<String, Refused> {
    let mut canonical = String::new();
    for &name in fields {
        match envelope.get(name) {
            Some(Value::String(value)) => {
                canonical.push_str(name);
                canonical.push('\n');
                canonical.push_str(value);
                canonical.push('\n');
            }
            None | Some(Value::Null) if name == "Subject" => {}
            _ => return Err(Refused::Missing(name)),
        }
    }
    Ok(canonical)
}

fn verify_signature(
    key: &RsaPublicKey,
    version: Version,
    signed: &[u8],
    signature: &[u8],
) -> Result<(), Refused> {
    let signature = Signature::try_from(signature).map_err(|_| Refused::BadSignature)?;
    let verified = match version {
        Version::Sha1 => VerifyingKey::<sha1::Sha1>::new(key.clone()).verify(signed, &signature),
        Version::Sha256 => {
            VerifyingKey::<sha2::Sha256>::new(key.clone()).verify(signed, &signature)
        }
    };
    verified.map_err(|_| Refused::BadSignature)
}

/// Whether `host` matches `^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$`.
pub(crate) fn is_sns_host(host: &str) -> bool {
    let Some(rest) = host.strip_prefix("sns.") else {
        return false;
    };
    let region = rest
        .strip_suffix(".amazonaws.com")
        .or_else(|| rest.strip_suffix(".amazonaws.com.cn"));
    region.is_some_and(|region| {
        !region.is_empty()
            && region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

/// An `https` URL on an SNS host, with no credentials and no port: what AWS's URLs are.
fn sns_url(text: &str) -> Option<url::Url> {
    let url = url::Url::parse(text).ok()?;
    let plain = url.scheme() == "https"
        && url.username().is_empty()
        && url.password().is_none()
        && url.port().is_none()
        && url.fragment().is_none();
    // `host_str` is the parsed host, lowercased; the text must name it the same way, so that
    // no parser difference (a backslash, an escape) reads another host.
    let host = url.host_str()?;
    let named = text
        .strip_prefix("https://")
        .and_then(|rest| rest.strip_prefix(host))
        .is_some_and(|rest| rest.starts_with('/'));
    (plain && named && is_sns_host(host)).then_some(url)
}

/// Whether `text` is a URL SNS signs with: an SNS host, a path ending `.pem`, no query.
pub(crate) fn is_sns_certificate_url(text: &str) -> bool {
    sns_url(text).is_some_and(|url| url.query().is_none() && url.path().ends_with(".pem"))
}

/// Whether `text` is SNS's confirmation URL for `topic_arn`: an SNS host, with
/// `Action=ConfirmSubscription` and that `TopicArn`.
pub(crate) fn is_sns_confirmation_url(text: &str, topic_arn: &str) -> bool {
    let Some(url) = sns_url(text) else {
        return false;
    };
    let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    let one = |name: &str| {
        let mut values = pairs
            .iter()
            .filter(|(key, _)| key == name)
            .map(|(_, value)| value.as_str());
        match (values.next(), values.next()) {
            (Some(value), None) => Some(value),
            _ => None,
        }
    };
    one("Action") == Some("ConfirmSubscription") && one("TopicArn") == Some(topic_arn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetched_body_fits_up_to_64_kib_and_not_a_byte_more() {
        assert!(fits(0));
        assert!(fits(MAX_FETCHED));
        assert!(!fits(MAX_FETCHED + 1));
    }

    fn key() -> RsaPublicKey {
        // A fixed 2048-bit modulus is not needed: the cache never reads the key.
        RsaPublicKey::new(
            rsa::BigUint::from(0xffff_ffff_ffff_fff1u64),
            rsa::BigUint::from(65_537u32),
        )
        .unwrap()
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn a_cached_key_is_given_while_its_certificate_is_valid() {
        let mut cache = CertificateCache::default();
        let not_after = at(1_000);
        cache.insert(
            "https://a/1.pem",
            CachedKey {
                key: key(),
                not_after,
            },
            at(0),
        );
        assert!(cache.get("https://a/1.pem", at(1_000)).is_some());
        assert!(cache.get("https://a/1.pem", at(1_001)).is_none());
        assert!(cache.get("https://a/2.pem", at(0)).is_none());
    }

    #[test]
    fn a_full_cache_drops_the_expired_keys_first_then_all() {
        let mut cache = CertificateCache::default();
        for index in 0..MAX_CACHED - 1 {
            let cached = CachedKey {
                key: key(),
                not_after: at(10_000),
            };
            cache.insert(&format!("https://a/{index}.pem"), cached, at(0));
        }
        let expiring = CachedKey {
            key: key(),
            not_after: at(100),
        };
        cache.insert("https://a/expiring.pem", expiring, at(0));
        assert_eq!(cache.keys.len(), MAX_CACHED);
        // Full: the one expired by now goes, the valid ones stay.
        let cached = CachedKey {
            key: key(),
            not_after: at(10_000),
        };
        cache.insert("https://a/new.pem", cached.clone(), at(101));
        assert_eq!(cache.keys.len(), MAX_CACHED);
        assert!(cache.get("https://a/0.pem", at(101)).is_some());
        assert!(!cache.keys.contains_key("https://a/expiring.pem"));
        // Full again with none expired: all go but the new one.
        cache.insert("https://a/newer.pem", cached, at(102));
        assert_eq!(cache.keys.len(), 1);
        assert!(cache.get("https://a/newer.pem", at(102)).is_some());
    }

    #[test]
    fn only_sns_hosts_match_the_pattern() {
        for host in [
            "sns.us-east-1.amazonaws.com",
            "sns.cn-north-1.amazonaws.com.cn",
            "sns.a.amazonaws.com",
        ] {
            assert!(is_sns_host(host), "{host}");
        }
        for host in [
            "sns.us-east-1.amazonaws.com.evil.test",
            "s3.amazonaws.com",
            "sns.amazonaws.com",
            "sns..amazonaws.com",
            "sns.us.east.amazonaws.com",
            "evil.sns.us-east-1.amazonaws.com",
            "sns.US-EAST-1.amazonaws.com",
            "sns.us_east.amazonaws.com",
        ] {
            assert!(!is_sns_host(host), "{host}");
        }
    }

    #[test]
    fn a_certificate_url_is_https_on_an_sns_host_with_a_pem_path_and_nothing_else() {
        assert!(is_sns_certificate_url(
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0000000000000000000000.pem"
        ));
        for url in [
            "http://sns.us-east-1.amazonaws.com/cert.pem",
            "https://sns.us-east-1.amazonaws.com.evil.test/cert.pem",
            "https://s3.amazonaws.com/bucket/cert.pem",
            "https://sns.us-east-1.amazonaws.com/cert.pem?x=1",
            "https://sns.us-east-1.amazonaws.com/cert.pem#x",
            "https://sns.us-east-1.amazonaws.com:8443/cert.pem",
            "https://user@sns.us-east-1.amazonaws.com/cert.pem",
            "https://sns.us-east-1.amazonaws.com/cert.txt",
            "https://evil.test\\@sns.us-east-1.amazonaws.com/cert.pem",
            "https:\\\\sns.us-east-1.amazonaws.com/cert.pem",
            "not a url",
        ] {
            assert!(!is_sns_certificate_url(url), "{url}");
        }
    }

    #[test]
    fn a_confirmation_url_confirms_the_signed_topic_on_an_sns_host() {
        let topic = "arn:aws:sns:us-east-1:123456789012:ses";
        let good = format!(
            "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn={topic}&Token=abc"
        );
        assert!(is_sns_confirmation_url(&good, topic));
        assert!(!is_sns_confirmation_url(
            &good,
            "arn:aws:sns:us-east-1:123456789012:other"
        ));
        assert!(!is_sns_confirmation_url(
            &good.replace("ConfirmSubscription", "Unsubscribe"),
            topic
        ));
        assert!(!is_sns_confirmation_url(
            &good.replace("https://sns.", "https://s3."),
            topic
        ));
        assert!(!is_sns_confirmation_url(
            &format!("{good}&Action=Subscribe"),
            topic
        ));
    }

    #[test]
    fn the_canonical_string_is_each_signed_field_as_name_newline_value_newline() {
        let envelope: Map<String, Value> = serde_json::from_str(
            r#"{"Type":"Notification","MessageId":"m","TopicArn":"t","Message":"hi","Timestamp":"x","Subject":"s","Extra":"e"}"#,
        )
        .unwrap();
        assert_eq!(
            canonical_string(&envelope, NOTIFICATION_FIELDS).unwrap(),
            "Message\nhi\nMessageId\nm\nSubject\ns\nTimestamp\nx\nTopicArn\nt\nType\nNotification\n"
        );
        let mut without_subject = envelope.clone();
        without_subject.remove("Subject");
        assert_eq!(
            canonical_string(&without_subject, NOTIFICATION_FIELDS).unwrap(),
            "Message\nhi\nMessageId\nm\nTimestamp\nx\nTopicArn\nt\nType\nNotification\n"
        );
        let mut without_message = envelope;
        without_message.remove("Message");
        assert_eq!(
            canonical_string(&without_message, NOTIFICATION_FIELDS),
            Err(Refused::Missing("Message"))
        );
    }
}
