//! Which web pages may open a WebSocket to a server: the `Origin` check
//! against cross-site WebSocket hijacking. A browser lets any page open a
//! WebSocket to any server, with that server's cookies, and says in
//! `Origin` which page asked; a server that authenticates by cookie must
//! refuse pages of other sites. The default is gorilla/websocket's rule:
//! a request without `Origin` (not from a browser) is let in, and one from a
//! browser only if its origin names the host the request was sent to.

use std::sync::Arc;

/// The origins a server lets in (see [`Config::allow_origins`]).
///
/// [`Config::allow_origins`]: crate::Config::allow_origins
#[derive(Clone, Debug)]
pub(crate) enum Origins {
    /// Pages of the host the request names (`Host`, or HTTP/2's
    /// `:authority`), and the origins listed (as a browser writes them:
    /// `scheme://host[:port]`, compared without regard to case); by
    /// default none are.
    Listed(Arc<[Box<str>]>),
    /// Every page.
    Any,
}

impl Default for Origins {
    fn default() -> Self {
        Origins::Listed(Arc::from([]))
    }
}

impl Origins {
    /// Whether a request with `origin` (its `Origin` field, if any) sent
    /// to `host` (its `Host` field) may open a WebSocket.
    pub(crate) fn allow(&self, origin: Option<&[u8]>, host: Option<&[u8]>) -> bool {
        let Some(origin) = origin.map(<[u8]>::trim_ascii) else {
            return true; // not a browser
        };
        let Origins::Listed(listed) = self else {
            return true; // Any
        };
        if listed
            .iter()
            .any(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin))
        {
            return true;
        }
        same_host(origin, host.map(<[u8]>::trim_ascii))
    }

    /// `origins` added to those let in.
    pub(crate) fn with(&self, origins: impl IntoIterator<Item = String>) -> Origins {
        let Origins::Listed(listed) = self else {
            return Origins::Any;
        };
        let mut listed = listed.to_vec();
        listed.extend(origins.into_iter().map(|origin| {
            origin
                .trim()
                .trim_end_matches('/')
                .to_owned()
                .into_boxed_str()
        }));
        Origins::Listed(listed.into())
    }
}

/// Whether `origin` (`scheme://host[:port]`) names `host` (`host[:port]`),
/// as gorilla/websocket compares them: the origin's host and port, as
/// written, against the `Host` field, without regard to case. An opaque
/// origin (`null`: a sandboxed page, a file) names no host.
fn same_host(origin: &[u8], host: Option<&[u8]>) -> bool {
    let Some(host) = host.filter(|host| !host.is_empty()) else {
        return false;
    };
    let Some(at) = origin.windows(3).position(|w| w == b"://") else {
        return false;
    };
    let named = &origin[at + 3..];
    !named.contains(&b'/') && named.eq_ignore_ascii_case(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(origins: &Origins, origin: Option<&str>, host: &str) -> bool {
        origins.allow(origin.map(str::as_bytes), Some(host.as_bytes()))
    }

    #[test]
    fn by_default_only_pages_of_the_requests_host() {
        let origins = Origins::default();
        assert!(
            allow(&origins, None, "example.com"),
            "no Origin: not a browser"
        );
        for same in [
            "https://example.com",
            "http://EXAMPLE.com",
            " https://example.com ",
        ] {
            assert!(allow(&origins, Some(same), "example.com"), "{same}");
        }
        assert!(allow(
            &origins,
            Some("http://127.0.0.1:9001"),
            "127.0.0.1:9001"
        ));
        for other in [
            "https://evil.example",
            "https://example.com.evil.example",
            "https://example.com:8443",
            "http://127.0.0.1:9002",
            "null",
            "example.com",
            "https://example.com/path",
            "",
        ] {
            assert!(!allow(&origins, Some(other), "example.com"), "{other}");
        }
        assert!(
            !origins.allow(Some(b"https://example.com"), None),
            "no Host"
        );
        assert!(!origins.allow(Some(b"https://"), Some(b"")), "empty Host");
    }

    #[test]
    fn listed_origins_are_let_in_beside_the_host() {
        let origins = Origins::default().with(["https://App.example/".to_owned()]);
        assert!(allow(&origins, Some("https://app.example"), "api.example"));
        assert!(allow(&origins, Some("https://api.example"), "api.example"));
        assert!(!allow(&origins, Some("http://app.example"), "api.example"));
        let more = origins.with(["http://localhost:3000".to_owned()]);
        assert!(allow(&more, Some("http://localhost:3000"), "api.example"));
        assert!(allow(&more, Some("https://app.example"), "api.example"));
    }

    #[test]
    fn any_lets_every_page_in() {
        let any = Origins::Any;
        assert!(allow(&any, Some("https://evil.example"), "example.com"));
        assert!(allow(&any, Some("null"), "example.com"));
        assert!(matches!(any.with(["https://a".to_owned()]), Origins::Any));
    }
}
