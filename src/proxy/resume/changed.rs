//! After a re-establishment: did the server change since its client was told (a deploy)?
//!
//! The new server's `initialize` result is compared with the one the client was told of, and
//! each list the client received is listed on the new session by holdfast itself (all pages)
//! and compared by digest ([`crate::session::told`]). What changed is logged, counted and acted
//! on by `[sessions.on_change]`: a changed list is told with its `notifications/*/list_changed`
//! on the client's event stream ([`crate::proxy::kept`]), other changes are carried, or the
//! session is ended the specification's way.
//!
//! A session this holdfast did not see opened (from its token: another replica's, or before a
//! restart of holdfast) has no record of what its client was told: every list the new server
//! offers is then taken as changed, so the client lists again (at most one list call too many
//! per kind), and the `initialize` result cannot be compared.

use http::{HeaderMap, HeaderValue, Method};
use serde_json::Value;

use super::{OwnAnswer, Resume, Resuming};
use crate::config::Act;
use crate::metrics::ServerChangeLabel;
use crate::proxy::Target;
use crate::replay::BodyHandle;
use crate::session::rpc::{self, Reply};
use crate::session::told::{self, Change, Digest, Had, List, Listing, Offer};
use crate::session::{Origin, Session};

/// Most pages of one list read: a server that pages for ever is taken as changed.
const MAX_PAGES: usize = 64;

/// What the comparison found, and what the session is told from now on.
pub(super) struct Compared {
    offer: Offer,
    lists: Vec<(List, Option<Digest>)>,
    changes: Vec<Change>,
}

/// What is done about what changed.
pub(super) enum Outcome {
    /// The session goes on (the client told of the lists that changed, if any).
    GoOn(Option<Compared>),
    /// A change `[sessions.on_change]` ends the session for: it is ended.
    End,
}

impl Resuming<'_> {
    /// Compares the server that answered the re-initialize with `result` with what `session`'s
    /// client was told, on the new session (`headers` name it). `client_version`: the
    /// `MCP-Protocol-Version` the client sends, the version it agreed on (known even where what
    /// it was told is not).
    pub(super) async fn compare(
        &self,
        session: &Session,
        own: &impl Fn(HeaderMap) -> Target,
        headers: &HeaderMap,
        result: &Value,
        client_version: Option<&HeaderValue>,
    ) -> Result<Option<Compared>, Resume> {
        let Some(offer) = Offer::of(result) else {
            return Ok(None);
        };
        let (was, had) = session.told(|t| (t.offer().cloned(), List::ALL.map(|l| t.had(l))));
        // Never told here: what the client holds is unknown, so every list offered is news.
        let unknown = was.is_none() && session.origin() == Origin::Token;
        let mut changes = was
            .as_ref()
            .map(|was| told::offer_changes(was, &offer))
            .unwrap_or_default();
        let sends_another =
            client_version.is_some_and(|v| v.as_bytes() != offer.protocol_version.as_bytes());
        if sends_another && !changes.contains(&Change::ProtocolVersion) {
            changes.insert(0, Change::ProtocolVersion);
        }
        let mut lists = Vec::new();
        for (list, had) in List::ALL.into_iter().zip(had) {
            let had = match had {
                Had::Nothing if unknown && offer.offers(list) => Had::Unknown,
                had => had,
            };
            if had == Had::Nothing {
                continue;
            }
            let now = self.digest(own, headers, list).await?;
            if told::list_changed(had, now) {
                changes.push(Change::List(list));
            }
            lists.push((list, now));
        }
        Ok(Some(Compared {
            offer,
            lists,
            changes,
        }))
    }

    /// Acts on what the comparison found: logged, counted, and by `[sessions.on_change]`.
    pub(super) async fn act(
        &self,
        compared: Option<Compared>,
        was: Option<(Box<str>, Box<str>)>,
        own: &impl Fn(HeaderMap) -> Target,
        headers: &HeaderMap,
    ) -> Outcome {
        let Some(compared) = compared else {
            return Outcome::GoOn(None);
        };
        if compared.changes.is_empty() {
            return Outcome::GoOn(Some(compared));
        }
        let on = self.keeper.on_change;
        let act_of = |change: &Change| match change {
            Change::List(_) => on.lists,
            Change::ProtocolVersion => on.protocol_version,
            Change::Capabilities => on.capabilities,
            Change::Instructions => on.instructions,
            Change::ServerInfo => on.server_info,
        };
        for change in &compared.changes {
            self.keeper
                .metrics
                .server_changes
                .get_or_create(&ServerChangeLabel::from(*change))
                .inc();
        }
        let what = compared
            .changes
            .iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let server = match was {
            Some((name, version)) => format!(
                "{name} {version} -> {} {}",
                compared.offer.server.0, compared.offer.server.1
            ),
            None => format!(
                "(not known here) -> {} {}",
                compared.offer.server.0, compared.offer.server.1
            ),
        };
        let ends: Vec<&str> = (compared.changes.iter())
            .filter(|c| act_of(c) == Act::End)
            .map(|c| c.as_str())
            .collect();
        if !ends.is_empty() {
            tracing::warn!(
                changed = %what,
                server = %server,
                ending_for = %ends.join(","),
                "a re-established MCP session found the server changed since its client was \
                 told (a deploy); sessions.on_change ends the session: the client gets the \
                 server's answer for a session it does not know"
            );
            self.close(own, headers).await;
            return Outcome::End;
        }
        let told: Vec<&str> = (compared.changes.iter())
            .filter(|c| act_of(c) == Act::Notify)
            .map(|c| c.as_str())
            .collect();
        tracing::info!(
            changed = %what,
            server = %server,
            told = %told.join(","),
            "a re-established MCP session found the server changed since its client was told \
             (a deploy); the client is told of the lists that changed, the rest is carried"
        );
        Outcome::GoOn(Some(compared))
    }

    /// The digest of `list` on the new session, all pages; `None` when the server would not
    /// list it whole (an error, too many pages): taken as changed. A missing backend is an
    /// error, held through as the request would be.
    async fn digest(
        &self,
        own: &impl Fn(HeaderMap) -> Target,
        headers: &HeaderMap,
        list: List,
    ) -> Result<Option<Digest>, Resume> {
        let mut listing = Listing::default();
        let mut cursor: Option<String> = None;
        for n in 0..MAX_PAGES {
            let body = rpc::list_request(list.method(), n, cursor.as_deref());
            let answer = match self.send_own(&own(headers.clone()), body, true).await {
                Ok(answer) => answer,
                Err(missing @ Resume::Missing(_)) => return Err(missing),
                Err(_) => return Ok(None),
            };
            let OwnAnswer {
                head,
                reply: Reply::Result(result),
            } = answer
            else {
                return Ok(None);
            };
            if !head.status.is_success() {
                return Ok(None);
            }
            match listing.page(list, &result) {
                Ok(Some(next)) => cursor = Some(next),
                Ok(None) => return Ok(Some(listing.finish())),
                Err(told::NotAPage) => return Ok(None),
            }
        }
        Ok(None)
    }

    /// Closes the new upstream session (DELETE), so the server does not keep a session nobody
    /// uses. Its answer does not matter: a server that keeps it forgets it in its own time.
    async fn close(&self, own: &impl Fn(HeaderMap) -> Target, headers: &HeaderMap) {
        let mut target = own(headers.clone());
        target.method = Method::DELETE;
        target.headers.remove(http::header::CONTENT_TYPE);
        let handle = BodyHandle::from_bytes(bytes::Bytes::new());
        let body = handle.attempt().expect("a new body can be sent");
        let route = (self.upstream.hold.routes_out()).then(|| self.upstream.route_of(&target));
        let (verdict, _) = self.upstream.attempt(&target, route.as_deref(), body).await;
        tracing::debug!(
            closed = verdict == crate::classify::Verdict::Application,
            "closed the session opened for a client whose session ends"
        );
    }
}

/// The session is now told of what the new server offers, and its client is to hear of the
/// lists that changed and `[sessions.on_change]` says to tell.
pub(super) fn tell(session: &Session, compared: Compared, notify_lists: bool) {
    let changed: Vec<List> = (compared.changes.iter())
        .filter_map(|c| match c {
            Change::List(list) if notify_lists => Some(*list),
            _ => None,
        })
        .collect();
    session.told_now(compared.offer, &compared.lists, &changed);
}
