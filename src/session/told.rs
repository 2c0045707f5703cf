//! What a carried session's client was told, so that a deploy's changes reach it.
//!
//! A container is recreated mostly because a new version is deployed, and a new version often
//! offers other tools. Clients cache what `initialize` and the list calls answered and list
//! again only when told a list changed; the new server sends no such notification, since for it
//! the re-established session is new. So holdfast keeps, per session, a digest of what the
//! client received ([`Told`]: the `initialize` result's parts, each list read page by page) and,
//! after a re-establishment, compares it with what the new server offers ([`changes`]).
//!
//! Everything here is pure: the proxy reads the answers and sends the requests.

use ring::digest;
use serde_json::Value;

/// A list a client caches, and the notification that tells it the list changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Tools,
    Prompts,
    Resources,
    Templates,
}

impl List {
    /// Every list, in the order they are compared.
    pub const ALL: [List; 4] = [List::Tools, List::Prompts, List::Resources, List::Templates];

    /// The method that lists it.
    pub fn method(self) -> &'static str {
        match self {
            List::Tools => "tools/list",
            List::Prompts => "prompts/list",
            List::Resources => "resources/list",
            List::Templates => "resources/templates/list",
        }
    }

    /// The list of `method`, if it is a list method.
    pub fn of_method(method: &str) -> Option<List> {
        List::ALL.into_iter().find(|list| list.method() == method)
    }

    /// The member of a page's result that holds its items.
    pub fn items(self) -> &'static str {
        match self {
            List::Tools => "tools",
            List::Prompts => "prompts",
            List::Resources => "resources",
            List::Templates => "resourceTemplates",
        }
    }

    /// The server capability that offers it.
    pub fn capability(self) -> &'static str {
        match self {
            List::Tools => "tools",
            List::Prompts => "prompts",
            List::Resources | List::Templates => "resources",
        }
    }

    /// The notification that makes a client list it again. Resource templates have none of
    /// their own: clients list both on the resources' one.
    pub fn notification(self) -> &'static str {
        match self {
            List::Tools => "notifications/tools/list_changed",
            List::Prompts => "notifications/prompts/list_changed",
            List::Resources | List::Templates => "notifications/resources/list_changed",
        }
    }

    /// Its name in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            List::Tools => "tools",
            List::Prompts => "prompts",
            List::Resources => "resources",
            List::Templates => "resource_templates",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// Its bit in a set of notifications to send (templates share the resources' one).
    fn bit(self) -> u8 {
        match self {
            List::Tools => 1,
            List::Prompts => 2,
            List::Resources | List::Templates => 4,
        }
    }
}

/// The notifications of `bits` (a set of [`List`] bits), one JSON-RPC message each.
pub fn notifications(bits: u8) -> impl Iterator<Item = &'static str> {
    [List::Tools, List::Prompts, List::Resources]
        .into_iter()
        .filter(move |list| bits & list.bit() != 0)
        .map(List::notification)
}

/// The first 16 bytes of a SHA-256: enough to tell two lists apart, small enough to keep per
/// session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest([u8; 16]);

impl std::fmt::Display for Digest {
    /// Its first 8 bytes in hexadecimal: what `holdfast probe` shows, to compare two versions.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0[..8].iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

fn digest_of(value: &Value) -> Digest {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(value.to_string().as_bytes());
    finish(ctx)
}

fn finish(ctx: digest::Context) -> Digest {
    let mut out = [0; 16];
    out.copy_from_slice(&ctx.finish().as_ref()[..16]);
    Digest(out)
}

/// A list read page by page, into one digest of its items in order.
pub struct Listing {
    ctx: digest::Context,
}

/// A result that is not a page of the list asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAPage;

impl Default for Listing {
    fn default() -> Self {
        Listing {
            ctx: digest::Context::new(&digest::SHA256),
        }
    }
}

impl Listing {
    /// Takes one page of `list`: the cursor of the next page, `None` after the last.
    pub fn page(&mut self, list: List, result: &Value) -> Result<Option<String>, NotAPage> {
        let items = result
            .get(list.items())
            .and_then(Value::as_array)
            .ok_or(NotAPage)?;
        for item in items {
            // Each item as serde writes it (its members in one order whatever the server's),
            // its length first so that no two lists hash alike by where items are cut.
            let text = item.to_string();
            self.ctx.update(&(text.len() as u64).to_be_bytes());
            self.ctx.update(text.as_bytes());
        }
        Ok(result
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned))
    }

    /// The digest of every page taken.
    pub fn finish(self) -> Digest {
        finish(self.ctx)
    }
}

/// What a server's `initialize` result said, as far as a client caches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// `protocolVersion`: the version the client and the server agreed on.
    pub protocol_version: Box<str>,
    /// `serverInfo.name` and `serverInfo.version`.
    pub server: (Box<str>, Box<str>),
    capabilities: Digest,
    instructions: Option<Digest>,
    /// The lists the server's capabilities offer.
    offers: [bool; 4],
}

/// Longest a `serverInfo` field is kept (a name and a version are short; a longer one is cut).
const MAX_INFO: usize = 128;

fn info(result: &Value, key: &str) -> Box<str> {
    let text = result
        .get("serverInfo")
        .and_then(|s| s.get(key))
        .and_then(Value::as_str)
        .unwrap_or("");
    let end = (0..=text.len().min(MAX_INFO))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    text[..end].into()
}

impl Offer {
    /// The parts of an `initialize` result (`None` when it is no object).
    pub fn of(result: &Value) -> Option<Offer> {
        result.as_object()?;
        let capabilities = result.get("capabilities").unwrap_or(&Value::Null);
        Some(Offer {
            protocol_version: result
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            server: (info(result, "name"), info(result, "version")),
            capabilities: digest_of(capabilities),
            instructions: result.get("instructions").map(digest_of),
            offers: List::ALL.map(|list| capabilities.get(list.capability()).is_some()),
        })
    }

    /// Whether the server's capabilities offer `list`.
    pub fn offers(&self, list: List) -> bool {
        self.offers[list.index()]
    }
}

/// What the client knows of one list.
#[derive(Default)]
enum Seen {
    /// It never received it (here).
    #[default]
    Never,
    /// It is reading it page by page.
    Reading(Box<Listing>),
    /// It received all of it: this digest.
    Read(Digest),
    /// It received it, but holdfast could not read it (too large, a page missed): a new
    /// server's list is taken as changed.
    Unread,
}

/// What one session's client was told, and the notifications it has yet to get.
#[derive(Default)]
pub struct Told {
    offer: Option<Box<Offer>>,
    lists: [Seen; 4],
    /// Notifications waiting for the client's event stream ([`List`] bits).
    pending: u8,
}

/// What the client had of a list when the server restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Had {
    /// Nothing: nothing to compare, nothing to tell.
    Nothing,
    /// All of it, with this digest.
    Digest(Digest),
    /// Something holdfast cannot compare: the new list is taken as changed.
    Unknown,
}

/// What changed between the server a client was told of and the one that now serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A list differs: told by its notification.
    List(List),
    /// `initialize` agreed on another protocol version.
    ProtocolVersion,
    /// The capabilities differ.
    Capabilities,
    /// The instructions differ (or came or went).
    Instructions,
    /// `serverInfo` (name or version) differs.
    ServerInfo,
}

impl Change {
    /// Its name in logs and in `holdfast_server_changes_total{what}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::List(list) => list.as_str(),
            Change::ProtocolVersion => "protocol_version",
            Change::Capabilities => "capabilities",
            Change::Instructions => "instructions",
            Change::ServerInfo => "server_info",
        }
    }
}

impl Told {
    /// The server answered the session's `initialize` with `result`.
    pub fn offered(&mut self, result: &Value) {
        self.offer = Offer::of(result).map(Box::new);
    }

    /// The client received a page of `list`: the first (`first`, asked without a cursor) starts
    /// the list again. `result` is `None` when the page could not be read.
    pub fn page(&mut self, list: List, first: bool, result: Option<&Value>) {
        let seen = &mut self.lists[list.index()];
        let mut listing = match std::mem::take(seen) {
            _ if first => Box::default(),
            Seen::Reading(listing) => listing,
            // A later page without its first (read before holdfast saw the session): what the
            // client holds cannot be known.
            _ => {
                *seen = Seen::Unread;
                return;
            }
        };
        *seen = match result.map(|r| listing.page(list, r)) {
            Some(Ok(Some(_))) => Seen::Reading(listing),
            Some(Ok(None)) => Seen::Read(listing.finish()),
            Some(Err(NotAPage)) | None => Seen::Unread,
        };
    }

    /// What the `initialize` answered, if holdfast read it.
    pub fn offer(&self) -> Option<&Offer> {
        self.offer.as_deref()
    }

    /// What the client has of `list`.
    pub fn had(&self, list: List) -> Had {
        match &self.lists[list.index()] {
            Seen::Never => Had::Nothing,
            Seen::Read(digest) => Had::Digest(*digest),
            Seen::Reading(_) | Seen::Unread => Had::Unknown,
        }
    }

    /// The client is now told of `offer` and of these lists (what a new server answered).
    pub fn now(&mut self, offer: Offer, lists: &[(List, Option<Digest>)]) {
        self.offer = Some(Box::new(offer));
        for &(list, digest) in lists {
            self.lists[list.index()] = digest.map_or(Seen::Unread, Seen::Read);
        }
    }

    /// The client is to be told that these lists changed.
    pub fn tell(&mut self, lists: impl IntoIterator<Item = List>) {
        for list in lists {
            self.pending |= list.bit();
        }
    }

    /// The notifications waiting (as [`List`] bits), taken.
    pub fn take_pending(&mut self) -> u8 {
        std::mem::take(&mut self.pending)
    }
}

/// What differs between the `initialize` the client was told of and a new server's.
pub fn offer_changes(was: &Offer, now: &Offer) -> Vec<Change> {
    let mut changes = Vec::new();
    if was.protocol_version != now.protocol_version {
        changes.push(Change::ProtocolVersion);
    }
    if was.capabilities != now.capabilities {
        changes.push(Change::Capabilities);
    }
    if was.instructions != now.instructions {
        changes.push(Change::Instructions);
    }
    if was.server != now.server {
        changes.push(Change::ServerInfo);
    }
    changes
}

/// Whether a list the client had (`had`) differs from the new server's (`now`: its digest, or
/// `None` when it could not be listed). A list the client never received is no change.
pub fn list_changed(had: Had, now: Option<Digest>) -> bool {
    match had {
        Had::Nothing => false,
        Had::Digest(was) => now != Some(was),
        Had::Unknown => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools(names: &[&str], next: Option<&str>) -> Value {
        let tools: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "inputSchema": {"type": "object"}}))
            .collect();
        match next {
            Some(cursor) => json!({"tools": tools, "nextCursor": cursor}),
            None => json!({"tools": tools}),
        }
    }

    fn digest_of_pages(pages: &[Value]) -> Digest {
        let mut listing = Listing::default();
        for page in pages {
            listing.page(List::Tools, page).unwrap();
        }
        listing.finish()
    }

    #[test]
    fn a_list_read_in_pages_digests_as_the_same_list_read_whole() {
        let mut told = Told::default();
        told.page(List::Tools, true, Some(&tools(&["a", "b"], Some("p2"))));
        assert_eq!(told.had(List::Tools), Had::Unknown, "half read");
        told.page(List::Tools, false, Some(&tools(&["c"], None)));
        let paged = told.had(List::Tools);
        let whole = digest_of_pages(&[tools(&["a", "b", "c"], None)]);
        assert_eq!(paged, Had::Digest(whole));
        // Where the pages are cut does not matter; what is in them does.
        let other_cut = digest_of_pages(&[tools(&["a"], Some("x")), tools(&["b", "c"], None)]);
        assert_eq!(whole, other_cut);
        assert_ne!(whole, digest_of_pages(&[tools(&["a", "b"], None)]));
        assert_ne!(whole, digest_of_pages(&[tools(&["a", "c", "b"], None)]));
    }

    #[test]
    fn members_in_another_order_are_the_same_item() {
        let one = json!({"tools": [{"name": "a", "description": "d"}]});
        let other: Value =
            serde_json::from_str(r#"{"tools": [{"description": "d", "name": "a"}]}"#).unwrap();
        assert_eq!(digest_of_pages(&[one]), digest_of_pages(&[other]));
    }

    #[test]
    fn a_first_page_starts_the_list_again_and_a_lone_later_page_is_unknown() {
        let mut told = Told::default();
        assert_eq!(told.had(List::Prompts), Had::Nothing);
        told.page(List::Tools, false, Some(&tools(&["z"], None)));
        assert_eq!(told.had(List::Tools), Had::Unknown);
        told.page(List::Tools, true, Some(&tools(&["a"], None)));
        assert_eq!(
            told.had(List::Tools),
            Had::Digest(digest_of_pages(&[tools(&["a"], None)]))
        );
        // A page that could not be read, or is no page of that list.
        told.page(List::Tools, true, None);
        assert_eq!(told.had(List::Tools), Had::Unknown);
        told.page(List::Prompts, true, Some(&json!({"tools": []})));
        assert_eq!(told.had(List::Prompts), Had::Unknown);
    }

    #[test]
    fn what_counts_as_a_changed_list() {
        let d = digest_of_pages(&[tools(&["a"], None)]);
        let e = digest_of_pages(&[tools(&["a", "b"], None)]);
        assert!(!list_changed(Had::Nothing, Some(e)));
        assert!(!list_changed(Had::Digest(d), Some(d)));
        assert!(list_changed(Had::Digest(d), Some(e)));
        assert!(list_changed(Had::Digest(d), None));
        assert!(list_changed(Had::Unknown, Some(d)));
    }

    fn init(version: &str, server: &str, instructions: Option<&str>, caps: Value) -> Value {
        let mut result = json!({
            "protocolVersion": version,
            "capabilities": caps,
            "serverInfo": {"name": "s", "version": server},
        });
        if let Some(text) = instructions {
            result["instructions"] = json!(text);
        }
        result
    }

    #[test]
    fn offers_differ_by_each_part() {
        let caps = json!({"tools": {"listChanged": true}});
        let was = Offer::of(&init("2025-06-18", "1.0", Some("hi"), caps.clone())).unwrap();
        let same = Offer::of(&init("2025-06-18", "1.0", Some("hi"), caps.clone())).unwrap();
        assert!(offer_changes(&was, &same).is_empty());
        let all = Offer::of(&init(
            "2025-03-26",
            "1.1",
            None,
            json!({"tools": {}, "prompts": {}}),
        ))
        .unwrap();
        assert_eq!(
            offer_changes(&was, &all),
            [
                Change::ProtocolVersion,
                Change::Capabilities,
                Change::Instructions,
                Change::ServerInfo
            ]
        );
        assert!(was.offers(List::Tools) && !was.offers(List::Prompts));
        assert!(all.offers(List::Prompts) && !all.offers(List::Templates));
        assert_eq!(&*all.server.1, "1.1");
        assert_eq!(Offer::of(&json!([1])), None);
    }

    #[test]
    fn a_long_server_version_is_cut_at_a_character() {
        let long = "é".repeat(100);
        let offer = Offer::of(&init("v", &long, None, json!({}))).unwrap();
        assert!(offer.server.1.len() <= MAX_INFO);
        assert!(offer.server.1.chars().all(|c| c == 'é'));
    }

    #[test]
    fn what_a_session_keeps_stays_small() {
        // Kept for every carried session (docs/sessions.md counts it): a few digests, the
        // initialize's parts behind one pointer.
        assert!(std::mem::size_of::<Told>() <= 112);
        assert!(std::mem::size_of::<Offer>() <= 112);
    }

    #[test]
    fn pending_notifications_are_a_set_taken_once() {
        let mut told = Told::default();
        told.tell([List::Templates, List::Tools, List::Resources]);
        let bits = told.take_pending();
        assert_eq!(
            notifications(bits).collect::<Vec<_>>(),
            [
                "notifications/tools/list_changed",
                "notifications/resources/list_changed"
            ]
        );
        assert_eq!(told.take_pending(), 0);
        assert_eq!(
            List::of_method("resources/templates/list"),
            Some(List::Templates)
        );
        assert_eq!(List::of_method("tools/call"), None);
    }
}
