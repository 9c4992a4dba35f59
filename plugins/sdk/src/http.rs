//! Header lookups.

use crate::Response;

/// Case-insensitive lookups in a `(name, value)` header list. The gateway
/// hands names over in lower case, but a plugin's own config may not be.
pub trait HeaderList {
    /// The first value of `name`.
    fn get_header(&self, name: &str) -> Option<&str>;
    /// Every value of `name`, in order.
    fn get_all_headers<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str>;
}

impl HeaderList for [(String, String)] {
    fn get_header(&self, name: &str) -> Option<&str> {
        self.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn get_all_headers<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// The first value of `name` in `headers`, ignoring case.
pub fn header_value<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.get_header(name)
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get_header(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lookup_ignores_case_and_keeps_repeats() {
        let headers: Vec<(String, String)> =
            [("x-api-key", "a"), ("X-Api-Key", "b"), ("other", "c")].map(|(n, v)| (n.into(), v.into())).to_vec();
        assert_eq!(headers.get_header("X-API-KEY"), Some("a"));
        assert_eq!(headers.get_all_headers("x-api-key").collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(header_value(&headers, "missing"), None);
        let response = Response { status: 200, headers };
        assert_eq!(response.header("OTHER"), Some("c"));
    }
}
