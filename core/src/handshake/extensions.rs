//! The `Sec-WebSocket-Extensions` header (RFC 6455 §9.1): a comma-separated
//! list of extension offers, each a token with `;`-separated parameters, a
//! parameter's value a token or a quoted string (whose unescaped content must
//! itself be a token).
//!
//! [`parse_extensions`] walks one header value without allocating: it checks
//! an offer's whole syntax before handing it out, and its parameters are then
//! read with [`Extension::params`], which cannot fail. A quoted value with
//! backslash escapes is the only case that allocates (to unescape it).

use std::borrow::Cow;

/// The header value is not valid `Sec-WebSocket-Extensions` syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtensionsError {
    /// The byte offset in the header value where parsing stopped.
    pub at: usize,
}

impl std::fmt::Display for ExtensionsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed Sec-WebSocket-Extensions at byte {}", self.at)
    }
}

impl std::error::Error for ExtensionsError {}

/// The offers in one `Sec-WebSocket-Extensions` header value, in order. Empty
/// list elements (`a, , b`) are skipped, as HTTP lists allow. After a syntax
/// error the iterator yields that error and ends.
pub fn parse_extensions(value: &str) -> Extensions<'_> {
    Extensions {
        text: value,
        pos: 0,
        failed: false,
    }
}

/// Iterator over the offers of one header value (see [`parse_extensions`]).
#[derive(Clone, Debug)]
pub struct Extensions<'a> {
    text: &'a str,
    pos: usize,
    failed: bool,
}

/// One extension offer: its name and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extension<'a> {
    /// The extension's name (`permessage-deflate`).
    pub name: &'a str,
    /// The parameters' text (`; a=1; b`), already checked.
    params: &'a str,
}

impl<'a> Extension<'a> {
    /// The offer's parameters, in order (duplicates included).
    pub fn params(&self) -> Params<'a> {
        Params {
            cursor: Cursor::new(self.params),
        }
    }
}

/// One parameter of an offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param<'a> {
    /// The parameter's name.
    pub name: &'a str,
    /// The value, unquoted and unescaped; `None` for a bare parameter.
    pub value: Option<Cow<'a, str>>,
}

/// Iterator over an offer's parameters (see [`Extension::params`]).
#[derive(Clone, Debug)]
pub struct Params<'a> {
    cursor: Cursor<'a>,
}

impl<'a> Iterator for Extensions<'a> {
    type Item = Result<Extension<'a>, ExtensionsError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let mut cursor = Cursor {
            text: self.text,
            pos: self.pos,
        };
        let parsed = next_extension(&mut cursor);
        self.pos = cursor.pos;
        match parsed {
            Ok(found) => found.map(Ok),
            Err(error) => {
                self.failed = true;
                Some(Err(error))
            }
        }
    }
}

impl<'a> Iterator for Params<'a> {
    type Item = Param<'a>;

    fn next(&mut self) -> Option<Param<'a>> {
        let cursor = &mut self.cursor;
        cursor.skip_space();
        if !cursor.eat(b';') {
            return None;
        }
        // Checked when the offer was parsed, so these cannot fail.
        param(cursor).ok()
    }
}

/// Skips empty elements and parses the next offer, leaving the cursor after
/// its comma (or at the end).
fn next_extension<'a>(cursor: &mut Cursor<'a>) -> Result<Option<Extension<'a>>, ExtensionsError> {
    loop {
        cursor.skip_space();
        if cursor.at_end() {
            return Ok(None);
        }
        if !cursor.eat(b',') {
            break;
        }
    }
    let name = cursor.token()?;
    let params_start = cursor.pos;
    loop {
        cursor.skip_space();
        let params_end = cursor.pos;
        if cursor.at_end() || cursor.eat(b',') {
            let params = &cursor.text[params_start..params_end];
            return Ok(Some(Extension { name, params }));
        }
        if !cursor.eat(b';') {
            return Err(cursor.error());
        }
        param(cursor)?;
    }
}

/// Parses `name [= value]` after a `;`.
fn param<'a>(cursor: &mut Cursor<'a>) -> Result<Param<'a>, ExtensionsError> {
    cursor.skip_space();
    let name = cursor.token()?;
    let mut after_name = cursor.clone();
    after_name.skip_space();
    if !after_name.eat(b'=') {
        return Ok(Param { name, value: None });
    }
    after_name.skip_space();
    *cursor = after_name;
    let value = if cursor.peek() == Some(b'"') {
        let start = cursor.pos;
        let value = cursor.quoted()?;
        if value.is_empty() || !value.bytes().all(is_token_byte) {
            // RFC 6455 §9.1: the unescaped value must be a token.
            return Err(ExtensionsError { at: start });
        }
        value
    } else {
        Cow::Borrowed(cursor.token()?)
    };
    Ok(Param {
        name,
        value: Some(value),
    })
}

#[derive(Clone, Debug)]
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Cursor { text, pos: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn at_end(&self) -> bool {
        self.pos == self.text.len()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        self.pos += usize::from(found);
        found
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    fn error(&self) -> ExtensionsError {
        ExtensionsError { at: self.pos }
    }

    /// One or more token characters (RFC 7230 `tchar`).
    fn token(&mut self) -> Result<&'a str, ExtensionsError> {
        let start = self.pos;
        while self.peek().is_some_and(is_token_byte) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error());
        }
        Ok(&self.text[start..self.pos])
    }

    /// A quoted string, unescaped; borrowed when it has no escapes.
    fn quoted(&mut self) -> Result<Cow<'a, str>, ExtensionsError> {
        let open = self.pos;
        self.pos += 1;
        let start = self.pos;
        let mut escaped = false;
        loop {
            match self.peek() {
                None => return Err(ExtensionsError { at: open }),
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    self.pos += 1;
                    if self.peek().is_none_or(|b| !is_quoted_byte(b)) {
                        return Err(self.error());
                    }
                    self.pos += 1;
                }
                Some(b) if is_quoted_byte(b) => self.pos += 1,
                Some(_) => return Err(self.error()),
            }
        }
        let inner = &self.text[start..self.pos];
        self.pos += 1;
        if !escaped {
            return Ok(Cow::Borrowed(inner));
        }
        let mut unescaped = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            unescaped.extend(if c == '\\' { chars.next() } else { Some(c) });
        }
        Ok(Cow::Owned(unescaped))
    }
}

/// RFC 7230 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Visible ASCII, space and tab: what a quoted string may hold (obs-text,
/// bytes above 0x7f, is refused: no extension value needs it).
fn is_quoted_byte(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | 0x21..=0x7e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An offer as (name, [(param, value)]).
    type Owned = (String, Vec<(String, Option<String>)>);

    /// Each offer, owned, or the error's offset.
    fn parsed(value: &str) -> Result<Vec<Owned>, usize> {
        parse_extensions(value)
            .map(|offer| {
                let offer = offer.map_err(|e| e.at)?;
                let params = offer
                    .params()
                    .map(|p| (p.name.to_owned(), p.value.map(Cow::into_owned)))
                    .collect();
                Ok((offer.name.to_owned(), params))
            })
            .collect()
    }

    fn param(name: &str, value: Option<&str>) -> (String, Option<String>) {
        (name.to_owned(), value.map(str::to_owned))
    }

    #[test]
    fn parses_what_browsers_send() {
        assert_eq!(
            parsed("permessage-deflate; client_max_window_bits"),
            Ok(vec![(
                "permessage-deflate".to_owned(),
                vec![param("client_max_window_bits", None)]
            )])
        );
    }

    #[test]
    fn parses_several_offers_with_values_and_spacing() {
        let value = "permessage-deflate ; server_max_window_bits = 10 ;client_no_context_takeover,\
                     permessage-deflate;client_max_window_bits=\"9\" ,  x-other";
        assert_eq!(
            parsed(value),
            Ok(vec![
                (
                    "permessage-deflate".to_owned(),
                    vec![
                        param("server_max_window_bits", Some("10")),
                        param("client_no_context_takeover", None),
                    ]
                ),
                (
                    "permessage-deflate".to_owned(),
                    vec![param("client_max_window_bits", Some("9"))]
                ),
                ("x-other".to_owned(), vec![]),
            ])
        );
    }

    #[test]
    fn unescapes_quoted_values_and_borrows_plain_ones() {
        let offers: Vec<_> = parse_extensions("e; a=\"1\\5\"; b=\"12\"").collect();
        let params: Vec<_> = offers[0].as_ref().unwrap().params().collect();
        assert_eq!(params[0].value, Some(Cow::Owned("15".to_owned())));
        assert!(matches!(params[1].value, Some(Cow::Borrowed("12"))));
    }

    #[test]
    fn skips_empty_list_elements() {
        assert_eq!(parsed(""), Ok(vec![]));
        assert_eq!(parsed(" , ,"), Ok(vec![]));
        assert_eq!(
            parsed(",a,, b ,"),
            Ok(vec![("a".to_owned(), vec![]), ("b".to_owned(), vec![])])
        );
    }

    #[test]
    fn rejects_malformed_syntax_where_it_breaks() {
        for (value, at) in [
            ("a;", 2),                // a parameter without a name
            ("a; =1", 3),             // the same
            ("a; b=", 5),             // a value missing
            ("a; b=\"1", 5),          // an unterminated quoted string
            ("a; b=\"\"", 5),         // an empty quoted value is not a token
            ("a; b=\"1 2\"", 5),      // nor is one with a space
            ("a; b=1 2", 7),          // two values
            ("a b", 2),               // two names
            ("a; b=1;; c", 7),        // an empty parameter
            ("a/b", 1),               // '/' is not a token character
            ("a; b=\"x\\\u{1}\"", 8), // an escaped control character
            ("é", 0),                 // not ASCII
        ] {
            assert_eq!(parsed(value), Err(at), "{value:?}");
        }
    }

    #[test]
    fn offers_before_an_error_are_still_yielded_then_it_stops() {
        let items: Vec<_> = parse_extensions("a; x=1, b c, d").collect();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].as_ref().unwrap().name, "a");
        assert_eq!(items[1], Err(ExtensionsError { at: 10 }));
    }
}
