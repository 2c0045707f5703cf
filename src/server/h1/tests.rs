//! How answers' heads are written for the client.

use super::*;

/// The field names of a written head, in order, and its `Connection` lines.
fn lines(head: &[u8]) -> (Vec<String>, Vec<String>) {
    let text = std::str::from_utf8(head).unwrap();
    let fields: Vec<(&str, &str)> = text
        .split("\r\n")
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| l.split_once(": ").unwrap())
        .collect();
    let names = fields.iter().map(|(n, _)| n.to_string()).collect();
    let connection = fields
        .iter()
        .filter(|(n, _)| *n == "connection")
        .map(|(_, v)| v.to_string())
        .collect();
    (names, connection)
}

#[test]
fn the_proxys_own_closing_answer_says_close_once_after_its_other_lines() {
    for version in [Version::HTTP_11, Version::HTTP_10] {
        let mut keep = true;
        let resp = crate::respond::bad_request("a test", version);
        let (head, framing, _) = answer_head(&Method::POST, version, resp, &mut keep);
        assert!(!keep, "{version:?}: the answer asked to close");
        assert!(matches!(framing, Framing::Length(n) if n > 0));
        assert!(head.starts_with(b"HTTP/1.1 400 Bad Request\r\n"));
        let (names, connection) = lines(&head);
        assert_eq!(
            names,
            [
                "content-type",
                "cache-control",
                "content-length",
                "date",
                "connection"
            ],
            "{version:?}"
        );
        assert_eq!(connection, ["close"], "{version:?}");
    }
}

#[test]
fn an_answer_without_connection_lines_keeps_the_connection_and_says_so_to_http_1_0() {
    for (version, said) in [
        (Version::HTTP_11, vec![]),
        (Version::HTTP_10, vec!["keep-alive".to_string()]),
    ] {
        let mut keep = true;
        let resp = crate::respond::ok_text("text/plain", "ok".into());
        let (head, _, _) = answer_head(&Method::GET, version, resp, &mut keep);
        assert!(keep, "{version:?}");
        assert_eq!(lines(&head).1, said, "{version:?}");
    }
}
