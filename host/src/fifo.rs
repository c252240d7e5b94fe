//! DeltaFIFO
