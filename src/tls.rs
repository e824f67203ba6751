//! The process's TLS crypto: ring, the provider kube's rustls already uses. reqwest takes the
//! process's default provider and panics building a client (even one for plain HTTP) when none
//! is installed, so everything that builds one installs it first.

/// Installs ring as the process's rustls crypto provider; later calls change nothing.
pub fn install_crypto_provider() {
    // An error only says a provider is installed already: this one, by an earlier call.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
