//! TODO-OWNER: module root
