import CCurl

extension TransportError {
    /// The error kind for a curl result. `capExceeded` says our write callback
    /// refused data because of `maxResponseBytes` (curl then reports WRITE_ERROR);
    /// `httpURL` says the request's own URL is http:// or https://;
    /// `redirected` that curl followed a redirect before it failed.
    static func kind(for code: CURLcode, capExceeded: Bool, httpURL: Bool, redirected: Bool = false) -> Kind {
        switch code {
        case CURLE_OPERATION_TIMEDOUT:
            return .timeout
        case CURLE_COULDNT_CONNECT:
            return .connect
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY:
            return .resolve
        case CURLE_TOO_MANY_REDIRECTS:
            return .tooManyRedirects
        case CURLE_FILESIZE_EXCEEDED:
            return .tooLarge
        case CURLE_WRITE_ERROR:
            return capExceeded ? .tooLarge : .network
        case CURLE_BAD_CONTENT_ENCODING:
            return .badContentEncoding
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM,
            CURLE_SSL_CIPHER, CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ENGINE_NOTFOUND,
            CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_ENGINE_INITFAILED, CURLE_SSL_SHUTDOWN_FAILED,
            CURLE_SSL_CRL_BADFILE, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH,
            CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CLIENTCERT, CURLE_USE_SSL_FAILED:
            return .tls
        case CURLE_UNSUPPORTED_PROTOCOL:
            // With an http(s) URL, the server's doing: a redirect to another
            // scheme, or a reply that is not HTTP at all (curl: "Received
            // HTTP/0.9 when not allowed"). Otherwise the caller's mistake.
            return httpURL ? .network : .invalidRequest
        case CURLE_URL_MALFORMAT:
            // After a redirect it is the server's Location that did not
            // parse (a control character in it), not the caller's URL.
            return redirected ? .network : .invalidRequest
        case CURLE_BAD_FUNCTION_ARGUMENT, CURLE_UNKNOWN_OPTION, CURLE_NOT_BUILT_IN:
            return .invalidRequest
        case CURLE_ABORTED_BY_CALLBACK:
            // The xferinfo callback stops a body over the cap; a cancel
            // stops a transfer this way too.
            return capExceeded ? .tooLarge : .cancelled
        case CURLE_OUT_OF_MEMORY:
            // Also libcurl's answer to a response header line over 100 KiB:
            // no transient failure, so not retried.
            return .tooLarge
        default:
            // RECV_ERROR, SEND_ERROR, PARTIAL_FILE, GOT_NOTHING, WEIRD_SERVER_REPLY,
            // HTTP2, HTTP2_STREAM, HTTP3, PROXY, OUT_OF_MEMORY, ...
            return .network
        }
    }

    /// `kind(for:)` corrected by what curl said:
    /// - a TLS handshake the peer reset or closed is a network failure (and
    ///   retried as one), not a TLS one: nothing was wrong with the TLS. By
    ///   curl's text, not `CURLINFO_OS_ERRNO`, which can be left over from
    ///   an address tried before (a refused ::1, then 127.0.0.1 with a real
    ///   TLS alert);
    /// - response headers over libcurl's 300 KiB in all are too large, not
    ///   a network failure to retry (as a single line over 100 KiB is).
    static func refinedKind(_ kind: Kind, code: CURLcode, text: String) -> Kind {
        if code == CURLE_SSL_CONNECT_ERROR
            && ["Recv failure", "Send failure", "SSL_ERROR_SYSCALL", "unexpected eof"].contains(where: text.contains)
        {
            return .network
        }
        if code == CURLE_RECV_ERROR && text.hasPrefix("Too large response headers") { return .tooLarge }
        return kind
    }

    /// curl's generic text for a code.
    static func curlText(_ code: CURLcode) -> String {
        guard let text = curl_easy_strerror(code) else { return "curl error \(code.rawValue)" }
        return String(cString: text)
    }
}
