//! kubectl as a real client (filled in below).
