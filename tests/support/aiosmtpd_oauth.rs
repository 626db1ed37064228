//! A real SMTP server that logs in with OAuth 2.0: Python's `aiosmtpd` with `XOAUTH2` and
//! `OAUTHBEARER` (RFC 7628) mechanisms whose authenticator checks the mailbox and the bearer
//! token, after STARTTLS (a certificate made with `openssl` for `localhost`, signed by a
//! test CA the client is told to trust). A separate launcher from `support::aiosmtpd`, so
//! that one stays as it is; both run
//! their script through [`ScriptServer`], which waits for the server's own answer.
//!
//! ```ignore
//! let Some(server) = OAuthSmtpd::start(test, Offered::Both) else { return };
//! let tls = Tls::Required(server.tls_parameters());
//! ```
//!
//! It accepts the user [`USER`] with the token [`GOOD_TOKEN`] and refuses any other: a
//! refused XOAUTH2 login gets `535` at once (as Microsoft 365 answers), a refused
//! OAUTHBEARER one the RFC's `334` error challenge first and `535` after the client's
//! `%x01` (as Gmail answers). It answers each message `250 2.0.0 Ok: queued as OAUTH1` and
//! is killed on drop.

use lettre::transport::smtp::client::TlsParameters;

use super::aiosmtpd::ScriptServer;

/// The mailbox the server accepts.
pub const USER: &str = "mailer@example.com";
/// The one token it accepts.
pub const GOOD_TOKEN: &str = "ya29.good-token";

/// Which OAuth mechanisms the server offers (and nothing else: no PLAIN, no LOGIN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    XOAuth2,
    OAuthBearer,
    Both,
}

const SCRIPT: &str = r#"
import argparse, asyncio, base64, json, ssl, sys
from aiosmtpd.smtp import SMTP, AuthResult

parser = argparse.ArgumentParser()
parser.add_argument("--offered", choices=["xoauth2", "oauthbearer", "both"], required=True)
parser.add_argument("--cert", required=True)
parser.add_argument("--key", required=True)
parser.add_argument("--user", required=True)
parser.add_argument("--token", required=True)
parser.add_argument("--clear", action="store_true")
args = parser.parse_args()

def log(line):
    print(line, file=sys.stderr, flush=True)

def fields(text, separator):
    out = {}
    for part in text.split(separator):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key] = value
    return out

def decode(args_):
    if len(args_) < 2:
        return None
    try:
        return base64.b64decode(args_[1], validate=True).decode()
    except Exception:
        return None

class Handler:
    async def handle_DATA(self, server, session, envelope):
        return "250 2.0.0 Ok: queued as OAUTH1"

    async def auth_XOAUTH2(self, server, args_):
        text = decode(args_)
        if text is None:
            return AuthResult(success=False, handled=False)
        parts = fields(text, "\x01")
        token = parts.get("auth", "").removeprefix("Bearer ")
        log("TOKEN XOAUTH2 " + token)
        ok = parts.get("user") == args.user and token == args.token and text.endswith("\x01\x01")
        return AuthResult(success=ok, handled=False)

    async def auth_OAUTHBEARER(self, server, args_):
        text = decode(args_)
        if text is None or not text.startswith("n,"):
            return AuthResult(success=False, handled=False)
        header, _, rest = text.partition("\x01")
        user = header.split(",")[1].removeprefix("a=").replace("=2C", ",").replace("=3D", "=")
        parts = fields(rest, "\x01")
        token = parts.get("auth", "").removeprefix("Bearer ")
        log("TOKEN OAUTHBEARER " + token)
        if user == args.user and token == args.token and "host" in parts and "port" in parts:
            return AuthResult(success=True)
        # RFC 7628 3.2.2: the error as a JSON challenge; the client answers %x01.
        error = json.dumps({"status": "invalid_token", "scope": "https://mail.google.com/"})
        answer = await server.challenge_auth(error)
        log("END " + repr(answer))
        return AuthResult(success=False, handled=False)

class LoggingSMTP(SMTP):
    async def smtp_AUTH(self, arg):
        log("AUTH " + (arg.split()[0] if arg else ""))
        return await super().smtp_AUTH(arg)

excluded = ["PLAIN", "LOGIN"]
if args.offered == "xoauth2":
    excluded.append("OAUTHBEARER")
if args.offered == "oauthbearer":
    excluded.append("XOAUTH2")
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(args.cert, args.key)
if args.clear:
    options = dict(require_starttls=False, auth_require_tls=False)
else:
    options = dict(tls_context=context, require_starttls=True, auth_require_tls=True)
options.update(auth_required=True, auth_exclude_mechanism=excluded)

async def main():
    # The server binds port 0 itself and says which port it got once it listens.
    handler = Handler()
    server = await asyncio.get_running_loop().create_server(
        lambda: LoggingSMTP(handler, **options), host="127.0.0.1", port=0)
    print("ready %d" % server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"#;

/// A running OAuth aiosmtpd on `127.0.0.1:<port>`, killed on drop.
#[derive(Debug)]
pub struct OAuthSmtpd {
    server: ScriptServer,
}

impl OAuthSmtpd {
    /// Starts the server on a loopback port it binds itself and waits until it greets there.
    ///
    /// Returns `None` after printing `SKIPPED <test>` when python3, aiosmtpd or openssl is
    /// missing; under `CI=true` that panics instead.
    pub fn start(test: &str, offered: Offered) -> Option<OAuthSmtpd> {
        OAuthSmtpd::launch(test, offered, false)
    }

    /// [`start`](Self::start), but without TLS and taking AUTH in clear text: for a client
    /// that cannot be told to trust the test CA (a DSN), with `auth_without_tls`.
    pub fn start_clear(test: &str, offered: Offered) -> Option<OAuthSmtpd> {
        OAuthSmtpd::launch(test, offered, true)
    }

    fn launch(test: &str, offered: Offered, clear: bool) -> Option<OAuthSmtpd> {
        let offered = match offered {
            Offered::XOAuth2 => "xoauth2",
            Offered::OAuthBearer => "oauthbearer",
            Offered::Both => "both",
        };
        let args = ["--offered", offered, "--user", USER, "--token", GOOD_TOKEN];
        let clear_arg: &[&str] = if clear { &["--clear"] } else { &[] };
        let args = args.iter().chain(clear_arg);
        let server = ScriptServer::launch(test, "aiosmtpd (OAuth)", SCRIPT, args, true)?;
        Some(OAuthSmtpd { server })
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// TLS for `localhost` that trusts the test CA which signed the server's certificate.
    pub fn tls_parameters(&self) -> TlsParameters {
        self.server.tls_parameters()
    }

    /// What the server wrote to stderr, for failure messages.
    pub fn log(&self) -> String {
        self.server.log()
    }

    /// The tokens the server was shown, each as `<MECHANISM> <token>`, in order.
    pub fn tokens_seen(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|line| line.strip_prefix("TOKEN "))
            .map(str::to_owned)
            .collect()
    }
}
