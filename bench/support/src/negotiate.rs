//! Which encoding a request's `Accept` header asks for, chosen as the API server chooses
//! (apimachinery's `endpoints/handlers/negotiation`).
//!
//! Invariants:
//! - The server offers a list of encodings, JSON first (discovery offers JSON alone). No
//!   `Accept` header (or an empty one) gets the first.
//! - The clauses are tried by quality (highest first; equal quality in header order), and
//!   within one quality more specific before wildcards; the first clause naming an offered
//!   encoding wins. `*/*` and `application/*` get the first offered (JSON).
//! - A clause with a quality of 0 is refused, as is one with a conversion parameter (`as`,
//!   `g`, `v`: `application/json;as=Table;v=v1;g=meta.k8s.io`) or any other parameter but
//!   `q`, `pretty` and `stream=watch` (watch only): the server serves no Table or
//!   PartialObjectMetadata, so a client asking for those gets its next clause, as from a
//!   server that lacks the conversion. YAML and CBOR are not offered (no consumer here asks).
//! - No clause served: [`Encoding`] is `None` and the server answers 406 Not Acceptable.
//!
//! Hand-written: the rules above are apimachinery's, not a generic Accept parser's (those
//! match parameters, sort differently, or give `*/*` no fixed answer).

/// How a response is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Protobuf,
}

struct Clause<'a> {
    media_type: &'a str,
    subtype: &'a str,
    quality: f32,
    params: Vec<(&'a str, &'a str)>,
}

fn parse(header: &str) -> Vec<Clause<'_>> {
    let mut clauses: Vec<Clause<'_>> = header
        .split(',')
        .filter_map(|part| {
            let mut pieces = part.split(';').map(str::trim);
            let (media_type, subtype) = pieces.next()?.split_once('/')?;
            let mut quality = 1.0;
            let mut params = Vec::new();
            for p in pieces {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                let (k, v) = (k.trim(), v.trim().trim_matches('"'));
                if k == "q" {
                    quality = v.parse().unwrap_or(0.0);
                } else {
                    params.push((k, v));
                }
            }
            Some(Clause { media_type: media_type.trim(), subtype: subtype.trim(), quality, params })
        })
        .collect();
    // Stable: header order within equal quality and specificity.
    let specificity = |c: &Clause<'_>| u8::from(c.media_type != "*") + u8::from(c.subtype != "*");
    clauses.sort_by(|a, b| b.quality.total_cmp(&a.quality).then(specificity(b).cmp(&specificity(a))));
    clauses
}

/// What the stream server offers for objects, lists and watches.
pub const OFFERED: &[Encoding] = &[Encoding::Json, Encoding::Protobuf];

/// The encoding for `accept` (the header's value, if any) among `offered` (the default
/// first); `watch` for a watch request.
pub fn negotiate(accept: Option<&str>, watch: bool, offered: &[Encoding]) -> Option<Encoding> {
    let header = accept.map(str::trim).unwrap_or("");
    if header.is_empty() {
        return offered.first().copied();
    }
    parse(header).into_iter().find_map(|c| {
        if c.quality <= 0.0 {
            return None;
        }
        let params_ok = c.params.iter().all(|(k, v)| match *k {
            "pretty" => true,
            "stream" => watch && *v == "watch",
            _ => false,
        });
        if !params_ok {
            return None;
        }
        match (c.media_type, c.subtype) {
            ("application", "*") | ("*", "*") => offered.first().copied(),
            ("application", "json") => offered.contains(&Encoding::Json).then_some(Encoding::Json),
            ("application", "vnd.kubernetes.protobuf") => {
                offered.contains(&Encoding::Protobuf).then_some(Encoding::Protobuf)
            }
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn negotiate(accept: Option<&str>, watch: bool) -> Option<Encoding> {
        super::negotiate(accept, watch, OFFERED)
    }

    #[test]
    fn discovery_offers_json_alone() {
        let json = &[Encoding::Json][..];
        let preferred = Some("application/vnd.kubernetes.protobuf,application/json");
        assert_eq!(super::negotiate(preferred, false, json), Some(Encoding::Json));
        assert_eq!(super::negotiate(Some("application/vnd.kubernetes.protobuf"), false, json), None);
        assert_eq!(super::negotiate(Some("*/*"), false, json), Some(Encoding::Json));
    }

    #[test]
    fn what_clients_send() {
        // kube-rs and wasmctrl.
        assert_eq!(negotiate(Some("application/json"), false), Some(Encoding::Json));
        assert_eq!(negotiate(None, true), Some(Encoding::Json));
        // client-go's typed clients (v0.37, protobuf preferred), and with ContentType set.
        let preferred = "application/vnd.kubernetes.protobuf,application/json";
        assert_eq!(negotiate(Some(preferred), true), Some(Encoding::Protobuf));
        assert_eq!(
            negotiate(Some("application/vnd.kubernetes.protobuf, */*"), false),
            Some(Encoding::Protobuf)
        );
        assert_eq!(negotiate(Some("application/json, */*"), false), Some(Encoding::Json));
        // kubectl get: Table first, which this server does not serve.
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(negotiate(Some(kubectl), false), Some(Encoding::Json));
        // Aggregated discovery, then plain JSON.
        let discovery =
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;q=0.9";
        assert_eq!(negotiate(Some(discovery), false), Some(Encoding::Json));
    }

    #[test]
    fn quality_wildcards_and_refusals() {
        assert_eq!(
            negotiate(Some("application/json;q=0.5, application/vnd.kubernetes.protobuf"), false),
            Some(Encoding::Protobuf)
        );
        assert_eq!(negotiate(Some("*/*"), false), Some(Encoding::Json));
        assert_eq!(negotiate(Some("application/*;q=0.1"), false), Some(Encoding::Json));
        assert_eq!(negotiate(Some("application/json;stream=watch"), true), Some(Encoding::Json));
        assert_eq!(negotiate(Some("application/json;stream=watch"), false), None);
        assert_eq!(negotiate(Some("application/json;q=0"), false), None);
        assert_eq!(negotiate(Some("application/yaml"), false), None);
        assert_eq!(negotiate(Some("application/json;as=Table;v=v1;g=meta.k8s.io"), false), None);
        assert_eq!(negotiate(Some("text/html, application/json;pretty=1"), false), Some(Encoding::Json));
    }
}
