//! Conversions between the SDK's types and the raw wit-bindgen ones. Pure: nothing here
//! calls an import, so it is tested natively.

use crate::bindings::wasmctrl::controller::types as wit;
use crate::{Error, Gvk, Kind};

pub(crate) fn gvk_of<K: Kind>() -> wit::Gvk {
    wit::Gvk { api_version: K::API_VERSION.to_owned(), kind: K::KIND.to_owned() }
}

pub(crate) fn gvk_to_wit(kind: &Gvk) -> wit::Gvk {
    wit::Gvk { api_version: kind.api_version.clone(), kind: kind.kind.clone() }
}

pub(crate) fn into_error(err: wit::Error) -> Error {
    match err {
        wit::Error::NotFound(m) => Error::NotFound(m),
        wit::Error::AlreadyExists(m) => Error::AlreadyExists(m),
        wit::Error::Conflict(m) => Error::Conflict(m),
        wit::Error::Forbidden(m) => Error::Forbidden(m),
        wit::Error::Invalid(m) => Error::Invalid(m),
        wit::Error::Unavailable(m) => Error::Unavailable(m),
        wit::Error::Other((status, message)) => Error::Other { status, message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;

    #[test]
    fn every_wit_error_case_maps_to_its_sdk_case() {
        assert!(into_error(wit::Error::NotFound("a".into())).is_not_found());
        assert!(into_error(wit::Error::AlreadyExists("a".into())).is_already_exists());
        assert!(into_error(wit::Error::Conflict("a".into())).is_conflict());
        assert!(into_error(wit::Error::Forbidden("a".into())).is_forbidden());
        assert!(into_error(wit::Error::Invalid("a".into())).is_invalid());
        assert!(into_error(wit::Error::Unavailable("a".into())).is_unavailable());
        assert_eq!(
            into_error(wit::Error::Other((500, "boom".into()))),
            Error::Other { status: 500, message: "boom".into() }
        );
    }

    #[test]
    fn gvk_conversion() {
        let g = gvk_of::<Deployment>();
        assert_eq!((g.api_version.as_str(), g.kind.as_str()), ("apps/v1", "Deployment"));
        let g = gvk_to_wit(&Gvk::new("example.com/v1", "Website"));
        assert_eq!((g.api_version.as_str(), g.kind.as_str()), ("example.com/v1", "Website"));
    }
}
