//! The reflector's list and watch requests, built with kube's request builders
//! ([`kube::core::Request`] with [`ListParams`] / [`WatchParams`]) and sent by the reflector
//! through the raw-bytes path (it parses the bodies itself).
//!
//! Invariants (the query parameters client-go's reflector sends):
//! - a list page carries `limit` when paged, then either `continue` or, when not empty, the
//!   `resourceVersion` — including `resourceVersion=0` on a paged first page (kube leaves it
//!   out there; the API server reads it as "serve from the watch cache", so it is added back);
//! - a watch carries `watch=true`, `allowWatchBookmarks=true`, `timeoutSeconds` (at least 1)
//!   and the `resourceVersion` when it is not empty (an empty one is left out, not sent as
//!   `resourceVersion=`);
//! - non-empty label and field selectors go on both; empty ones are left out;
//! - every request asks for `application/json`.

use kube::core::Request;
use kube::core::params::{ListParams, WatchParams};

use super::error::ReflectorError;

/// Builds the list and watch requests of one collection.
#[derive(Debug, Clone)]
pub(crate) struct Requests {
    request: Request,
    label_selector: Option<String>,
    field_selector: Option<String>,
}

impl Requests {
    /// Requests on the collection at `path`, with the given selectors.
    pub(crate) fn new(path: String, label_selector: Option<&str>, field_selector: Option<&str>) -> Self {
        let non_empty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_owned);
        Self {
            request: Request::new(path),
            label_selector: non_empty(label_selector),
            field_selector: non_empty(field_selector),
        }
    }

    /// One list page: `limit` when `page_size` is given, then `continue` when given,
    /// else `resource_version` when not empty.
    pub(crate) fn list(
        &self,
        resource_version: &str,
        page_size: Option<u32>,
        continue_token: Option<&str>,
    ) -> Result<http::Request<Vec<u8>>, ReflectorError> {
        let params = ListParams {
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            limit: page_size,
            continue_token: continue_token.map(str::to_owned),
            resource_version: (!resource_version.is_empty()).then(|| resource_version.to_owned()),
            ..ListParams::default()
        };
        let request = self.request.list(&params).map_err(|e| ReflectorError::Request(e.to_string()))?;
        let watch_cache_page = page_size.is_some() && continue_token.is_none() && resource_version == "0";
        finish(request, |uri| {
            if watch_cache_page {
                // kube drops `resourceVersion=0` when `limit` is set; client-go sends both, and
                // the API server then answers from its watch cache, not a consistent etcd read.
                uri.push_str("&resourceVersion=0");
            }
        })
    }

    /// A watch from `resource_version` (from "now" when empty), ended by the server after
    /// `timeout_secs`.
    pub(crate) fn watch(
        &self,
        resource_version: &str,
        timeout_secs: u32,
    ) -> Result<http::Request<Vec<u8>>, ReflectorError> {
        let mut params = WatchParams::default().timeout(timeout_secs.max(1));
        params.label_selector = self.label_selector.clone();
        params.field_selector = self.field_selector.clone();
        let request = self
            .request
            .watch(&params, resource_version)
            .map_err(|e| ReflectorError::Request(e.to_string()))?;
        finish(request, |uri| {
            if resource_version.is_empty() {
                // kube always appends the resourceVersion (last); an empty one is left out, as
                // client-go does (some servers reject `resourceVersion=` as unparseable).
                if let Some(len) = uri.strip_suffix("&resourceVersion=").map(str::len) {
                    uri.truncate(len);
                }
            }
        })
    }
}

/// Applies `adjust` to the request's URI, drops the empty first pair kube's builders start the
/// query with (`path?&a=b` → `path?a=b`) and a query left empty, and asks for JSON.
fn finish(
    mut request: http::Request<Vec<u8>>,
    adjust: impl FnOnce(&mut String),
) -> Result<http::Request<Vec<u8>>, ReflectorError> {
    let mut uri = request.uri().to_string();
    adjust(&mut uri);
    if let Some(at) = uri.find("?&") {
        uri.remove(at + 1);
    }
    if uri.ends_with('?') {
        uri.pop();
    }
    *request.uri_mut() =
        uri.parse().map_err(|e: http::uri::InvalidUri| ReflectorError::Request(e.to_string()))?;
    request.headers_mut().insert(http::header::ACCEPT, http::HeaderValue::from_static("application/json"));
    Ok(request)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The request's path and its decoded query parameters.
    fn parts(request: &http::Request<Vec<u8>>) -> (String, BTreeMap<String, String>) {
        let uri = request.uri();
        let query = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect();
        assert_eq!(request.headers()[http::header::ACCEPT], "application/json");
        assert_eq!(request.method(), http::Method::GET);
        (uri.path().to_owned(), query)
    }

    fn q(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const PATH: &str = "/api/v1/namespaces/default/configmaps";

    #[test]
    fn first_page_from_the_watch_cache_keeps_resource_version_zero() {
        let r = Requests::new(PATH.into(), None, None);
        let (path, query) = parts(&r.list("0", Some(500), None).unwrap());
        assert_eq!(path, PATH);
        assert_eq!(query, q(&[("limit", "500"), ("resourceVersion", "0")]));
    }

    #[test]
    fn continued_pages_carry_the_token_and_no_resource_version() {
        let r = Requests::new(PATH.into(), None, None);
        let (_, query) = parts(&r.list("0", Some(500), Some("tok/en=")).unwrap());
        assert_eq!(query, q(&[("limit", "500"), ("continue", "tok/en=")]));
    }

    #[test]
    fn consistent_and_specific_lists() {
        let r = Requests::new(PATH.into(), None, None);
        let (_, query) = parts(&r.list("", Some(500), None).unwrap());
        assert_eq!(query, q(&[("limit", "500")]), "a consistent read sends no resourceVersion");
        let (_, query) = parts(&r.list("1234", None, None).unwrap());
        assert_eq!(query, q(&[("resourceVersion", "1234")]), "a relist from a version is not paged");
        let (_, query) = parts(&r.list("", None, None).unwrap());
        assert!(query.is_empty());
    }

    #[test]
    fn selectors_are_encoded_and_empty_ones_left_out() {
        let r = Requests::new(PATH.into(), Some("app in (a,b),!x"), Some("metadata.name=n"));
        let request = r.list("0", Some(10), None).unwrap();
        let (_, query) = parts(&request);
        assert_eq!(
            query,
            q(&[
                ("labelSelector", "app in (a,b),!x"),
                ("fieldSelector", "metadata.name=n"),
                ("limit", "10"),
                ("resourceVersion", "0"),
            ])
        );
        assert!(!request.uri().to_string().contains(' '), "values are encoded");
        let r = Requests::new(PATH.into(), Some(""), Some(""));
        let (_, query) = parts(&r.watch("5", 300).unwrap());
        assert!(!query.contains_key("labelSelector") && !query.contains_key("fieldSelector"));
    }

    #[test]
    fn queries_start_without_an_empty_pair() {
        let r = Requests::new(PATH.into(), None, None);
        assert_eq!(
            r.list("0", Some(500), None).unwrap().uri(),
            "/api/v1/namespaces/default/configmaps?limit=500&resourceVersion=0"
        );
        assert_eq!(r.list("", None, None).unwrap().uri(), PATH);
        assert!(r.watch("", 300).unwrap().uri().query().unwrap().starts_with("watch=true&"));
    }

    #[test]
    fn watch_parameters() {
        let r = Requests::new(PATH.into(), Some("a=b"), None);
        let (path, query) = parts(&r.watch("42", 417).unwrap());
        assert_eq!(path, PATH);
        assert_eq!(
            query,
            q(&[
                ("watch", "true"),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", "417"),
                ("labelSelector", "a=b"),
                ("resourceVersion", "42"),
            ])
        );
        let (_, query) = parts(&r.watch("", 0).unwrap());
        assert_eq!(query.get("timeoutSeconds").map(String::as_str), Some("1"));
        assert!(!query.contains_key("resourceVersion"), "an empty resourceVersion is left out");
    }
}
