/// An endpoint template that cannot be expanded.
public struct URLTemplateError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The template that was rejected.
    public let template: String
    /// Human-readable reason.
    public let message: String

    /// Creates an error.
    public init(template: String, message: String) {
        self.template = template
        self.message = message
    }

    /// The message.
    public var description: String { message }
}

/// Small URL text helpers for building search requests and classifying URLs. No parsing
/// beyond what the engine needs; libcurl remains the authority on what it will fetch.
public enum URLUtilities {
    /// Percent-encodes `text` per RFC 3986: the unreserved characters (`A-Z a-z 0-9 - . _ ~`)
    /// are kept, every other UTF-8 byte becomes `%XX` with uppercase hex digits, so a space
    /// is `%20` (never `+`) and `é` is `%C3%A9`.
    public static func percentEncode(_ text: String) -> String {
        var text = text
        return text.withUTF8 { bytes in
            String(unsafeUninitializedCapacity: bytes.count * 3) { out in encode(bytes, into: out, at: 0) }
        }
    }

    /// The uppercase hex digit for `nibble` (0...15).
    @inline(__always)
    private static func hexDigit(_ nibble: UInt8) -> UInt8 {
        nibble < 10 ? 0x30 + nibble : 0x37 + nibble  // "0"... or "A"...
    }

    /// Writes the percent-encoding of `bytes` into `out` from `start` (room for 3 bytes
    /// per input byte); returns the index after the last byte written.
    private static func encode(_ bytes: UnsafeBufferPointer<UInt8>, into out: UnsafeMutableBufferPointer<UInt8>,
                               at start: Int) -> Int {
        var o = start
        for byte in bytes {
            if isUnreserved(byte) {
                out[o] = byte
                o += 1
            } else {
                out[o] = UInt8(ascii: "%")
                out[o + 1] = hexDigit(byte >> 4)
                out[o + 2] = hexDigit(byte & 0x0F)
                o += 3
            }
        }
        return o
    }

    /// `url` with every byte that is not ASCII percent-encoded (`%XX`,
    /// uppercase), as RFC 3987 §3.1 maps an IRI to a URI: such bytes are not
    /// allowed in an HTTP request-target (libcurl encoded them in the path
    /// but sent them raw in the query). `url` itself when it is all ASCII.
    public static func encodingNonASCII(_ url: String) -> String {
        guard url.utf8.contains(where: { $0 >= 0x80 }) else { return url }
        var out: [UInt8] = []
        out.reserveCapacity(url.utf8.count * 2)
        for byte in url.utf8 {
            if byte < 0x80 {
                out.append(byte)
            } else {
                out += [UInt8(ascii: "%"), hexDigit(byte >> 4), hexDigit(byte & 0x0F)]
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// `url` as messages and logs show it: a password in its userinfo
    /// (`user:password@`) is written `***`, and so is a userinfo with no
    /// password (`TOKEN@`, `TOKEN:@`: a token given as the user name, as
    /// for many APIs, is the secret). `url` itself when it has no userinfo.
    ///
    /// Also for text that is not a well-formed URL (a Location a server
    /// sent): after `scheme:`, any run of `/` or `\` (browsers read
    /// `http:\\user:pw@host` and `http:user:pw@host` as userinfo too), up
    /// to the first `/`, `\`, `?` or `#`.
    public static func redactingPassword(_ url: String) -> String {
        let bytes = Array(url.utf8)
        guard let (start, at) = userinfo(bytes, lenient: true) else { return url }
        guard let colon = bytes[start..<at].firstIndex(of: UInt8(ascii: ":")), colon + 1 < at else {
            return String(decoding: bytes[..<start] + Array("***".utf8) + bytes[at...], as: UTF8.self)
        }
        return String(decoding: bytes[..<(colon + 1)] + Array("***".utf8) + bytes[at...], as: UTF8.self)
    }

    /// `url` without its userinfo (`user:password@`); `url` itself when it has none.
    public static func removingUserinfo(_ url: String) -> String {
        let bytes = Array(url.utf8)
        guard let (start, at) = userinfo(bytes) else { return url }
        return String(decoding: bytes[..<start] + bytes[(at + 1)...], as: UTF8.self)
    }

    /// The userinfo of an absolute URL (`user:password`), nil without one.
    public static func userinfo(of url: String) -> String? {
        let bytes = Array(url.utf8)
        guard let (start, at) = userinfo(bytes) else { return nil }
        return String(decoding: bytes[start..<at], as: UTF8.self)
    }

    /// `url` (an absolute URL without userinfo) with `info@` before its host.
    public static func addingUserinfo(_ info: String, to url: String) -> String {
        guard let scheme = url.firstRange(of: "://") else { return url }
        return String(url[..<scheme.upperBound]) + info + "@" + String(url[scheme.upperBound...])
    }

    /// Where the userinfo of an absolute URL starts, and the index of the
    /// `@` that ends it; nil without one.
    private static func userinfo(_ bytes: [UInt8], lenient: Bool = false) -> (start: Int, at: Int)? {
        guard let scheme = bytes.firstIndex(of: UInt8(ascii: ":")), scheme > 0,
              bytes[..<scheme].allSatisfy({ isSchemeByte($0) }) else { return nil }
        var start = scheme + 1
        if lenient {
            while start < bytes.count, bytes[start] == UInt8(ascii: "/") || bytes[start] == UInt8(ascii: "\\") {
                start += 1
            }
        } else {
            guard scheme + 2 < bytes.count, bytes[scheme + 1] == UInt8(ascii: "/"),
                  bytes[scheme + 2] == UInt8(ascii: "/") else { return nil }
            start = scheme + 3
        }
        let ends = lenient ? "/\\?#" : "/?#"
        var end = start
        while end < bytes.count, !ends.utf8.contains(bytes[end]) { end += 1 }
        guard let at = bytes[start..<end].lastIndex(of: UInt8(ascii: "@")) else { return nil }
        return (start, at)
    }

    /// `url` as the HTTP cache compares it (RFC 9110 §4.2.3): scheme and
    /// host in lower case, no fragment (it is never sent), an empty path
    /// as "/", and no port where it is the scheme's default (80 for http,
    /// 443 for https). The userinfo, path and query are kept as they are.
    public static func cacheForm(_ url: String) -> String {
        // Most URLs are in that form already: looked at in place, copied
        // only to change them (this runs for every GET the cache may answer).
        var copy = url
        let form = copy.withUTF8 { bytes -> [UInt8]? in
            let length = bytes.firstIndex(of: UInt8(ascii: "#")) ?? bytes.count
            guard let colon = bytes[..<length].firstIndex(of: UInt8(ascii: ":")), colon > 0,
                  bytes[..<colon].allSatisfy({ isSchemeByte($0) }) else {
                return length < bytes.count ? Array(bytes[..<length]) : nil
            }
            let upper = { (i: Int) in bytes[i] != asciiLowercased(bytes[i]) }
            guard colon + 2 < length, bytes[colon + 1] == UInt8(ascii: "/"), bytes[colon + 2] == UInt8(ascii: "/") else {
                guard length < bytes.count || (0..<colon).contains(where: upper) else { return nil }
                var out = Array(bytes[..<length])
                for i in 0..<colon { out[i] = asciiLowercased(out[i]) }
                return out
            }
            var end = colon + 3  // the authority: up to the path or query
            while end < length, bytes[end] != UInt8(ascii: "/"), bytes[end] != UInt8(ascii: "?") { end += 1 }
            let host = bytes[(colon + 3)..<end].lastIndex(of: UInt8(ascii: "@")).map { $0 + 1 } ?? colon + 3
            // A port: after the last ":" that is not inside an IPv6 literal.
            var portColon: Int? = nil
            if let last = bytes[host..<end].lastIndex(of: UInt8(ascii: ":")),
               !bytes[last..<end].contains(UInt8(ascii: "]")) {
                portColon = last
            }
            let scheme = String(decoding: bytes[..<colon].map(asciiLowercased), as: UTF8.self)
            let port = portColon.map { String(decoding: bytes[($0 + 1)..<end], as: UTF8.self) }
            // An empty port is the default one too (RFC 3986 §6.2.3).
            let defaultPort = port != nil
                && (port == "" || (scheme == "http" && port == "80") || (scheme == "https" && port == "443"))
            let emptyPath = end == length || bytes[end] == UInt8(ascii: "?")
            guard length < bytes.count || defaultPort || emptyPath || (0..<colon).contains(where: upper)
                    || (host..<end).contains(where: upper) else { return nil }
            var out = Array(bytes[..<colon].map(asciiLowercased))
            out += bytes[colon..<host]
            out += bytes[host..<(defaultPort ? portColon! : end)].map(asciiLowercased)
            if emptyPath { out.append(UInt8(ascii: "/")) }
            out += bytes[end..<length]
            return out
        }
        return form.map { String(decoding: $0, as: UTF8.self) } ?? url
    }

    /// A letter, digit, `+`, `-` or `.` (RFC 3986 §3.1).
    private static func isSchemeByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
             UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."):
            return true
        default:
            return false
        }
    }

    /// "{query}" (made once).
    private static let placeholder = Array("{query}".utf8)

    /// Replaces every `{query}` in `template` with `percentEncode(query)`.
    ///
    /// The match is on exact bytes (no Unicode normalization); the rest of the template is
    /// copied unchanged. Throws if the template contains no `{query}`: a search endpoint
    /// that ignores the query is a configuration mistake.
    public static func expandTemplate(_ template: String, query: String) throws(URLTemplateError)
        -> String
    {
        var template = template
        var query = query
        // Built in place: one allocation for the result, none per call besides
        // (a search submit expands its endpoint's template every time).
        let expanded: String? = template.withUTF8 { source in
            query.withUTF8 { q in
                func isPlaceholder(at i: Int) -> Bool {
                    i + 7 <= source.count && source[i..<(i + 7)].elementsEqual(placeholder)
                }
                var count = 0
                var i = 0
                while i < source.count {
                    if isPlaceholder(at: i) {
                        count += 1
                        i += 7
                    } else {
                        i += 1
                    }
                }
                guard count > 0 else { return nil }
                // A query of dots alone ("." or "..") standing where a path
                // segment is would be a dot-segment, which the URL's
                // normalization removes with the segment before it: the
                // request would go to another path. In the path its dots are
                // written %2E (RFC 3986 §2.3: the same characters).
                let dotsOnly = !q.isEmpty && q.allSatisfy { $0 == UInt8(ascii: ".") }
                return String(unsafeUninitializedCapacity: source.count + count * max(0, q.count * 3 - 7)) { out in
                    var o = 0
                    var i = 0
                    var inPath = true  // before any "?" or "#" of the template
                    while i < source.count {
                        if isPlaceholder(at: i) {
                            if dotsOnly && inPath {
                                for _ in 0..<q.count {
                                    out[o] = UInt8(ascii: "%")
                                    out[o + 1] = UInt8(ascii: "2")
                                    out[o + 2] = UInt8(ascii: "E")
                                    o += 3
                                }
                            } else {
                                o = encode(q, into: out, at: o)
                            }
                            i += 7
                        } else {
                            if source[i] == UInt8(ascii: "?") || source[i] == UInt8(ascii: "#") { inPath = false }
                            out[o] = source[i]
                            o += 1
                            i += 1
                        }
                    }
                    return o
                }
            }
        }
        guard let expanded else {
            throw URLTemplateError(
                template: template,
                message: "endpoint template \(JSONPointer.quoted(template)) has no {query} "
                    + "placeholder")
        }
        return expanded
    }

    /// `name=value` pairs, both percent-encoded, joined with `&`, in the given order
    /// (e.g. `[("a", "1"), ("b", "x y")]` gives `a=1&b=x%20y`). Empty input gives `""`.
    public static func encodeQueryItems(_ items: [(String, String)]) -> String {
        var result = ""
        for (index, (name, value)) in items.enumerated() {
            if index > 0 { result += "&" }
            result += percentEncode(name)
            result += "="
            result += percentEncode(value)
        }
        return result
    }

    /// The host and port of an `http` or `https` URL, normalized for use as a per-host key:
    /// `host` or `host:port`, ASCII letters lowercased, IPv6 literals kept in brackets
    /// (`[::1]:8080`).
    ///
    /// - The scheme is matched case-insensitively and must be followed by `//`.
    /// - User information (`user:pw@`) is dropped. More than one `@` in the authority is
    ///   rejected: RFC 3986 forbids it and parsers disagree on where the host starts.
    /// - The port is written without leading zeros and dropped when it is the scheme's
    ///   default (80 for http, 443 for https) or empty, so `http://A:80/` and `http://a/`
    ///   share a key.
    /// - Returns nil for any other scheme, a missing or empty host, a port that is not a
    ///   number up to 65535, control characters, spaces or characters not allowed in an
    ///   authority (such as `\`), and malformed IPv6 literals. Non-ASCII host names (IDN)
    ///   are accepted as they are.
    public static func hostOf(url: String) -> String? {
        var url = url
        return url.withUTF8 { hostOf(utf8: $0) }
    }

    /// `hostOf(url:)` on the URL's bytes. Runs for every request submit, so
    /// the common case (a lower-case host, a port written plainly or none)
    /// makes the answer from one slice of the bytes, without arrays.
    static func hostOf(utf8 bytes: UnsafeBufferPointer<UInt8>) -> String? {
        // Scheme.
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")) else { return nil }
        let defaultPort: Int
        if colon == 4 && Self.lowerCaseEquals(bytes[..<colon], "http") {
            defaultPort = 80
        } else if colon == 5 && Self.lowerCaseEquals(bytes[..<colon], "https") {
            defaultPort = 443
        } else {
            return nil
        }
        let slash = UInt8(ascii: "/")
        guard colon + 2 < bytes.count, bytes[colon + 1] == slash, bytes[colon + 2] == slash
        else { return nil }
        // Authority: up to the first "/", "?" or "#".
        let start = colon + 3
        var end = start
        while end < bytes.count, bytes[end] != slash, bytes[end] != UInt8(ascii: "?"),
            bytes[end] != UInt8(ascii: "#")
        {
            end += 1
        }
        var authority = bytes[start..<end]
        if let at = authority.lastIndex(of: UInt8(ascii: "@")) {
            // (Bytes that are not ASCII are percent-encoded before sending,
            // as in the rest of the URL.)
            let userinfo = authority[..<at]
            guard userinfo.allSatisfy({ isUnreserved($0) || isSubDelim($0) || $0 == 0x3A || $0 == 0x25 || $0 >= 0x80 })
            else { return nil }
            authority = authority[(at + 1)...]
        }
        // Host and port.
        var host: [UInt8]? = nil       // nil: the host is `hostBytes` as written
        var hostBytes: Slice<UnsafeBufferPointer<UInt8>>
        var portText: Slice<UnsafeBufferPointer<UInt8>>
        if authority.first == UInt8(ascii: "[") {
            guard let close = authority.firstIndex(of: UInt8(ascii: "]")) else { return nil }
            let literal = authority[(authority.startIndex + 1)..<close]
            guard literal.contains(UInt8(ascii: ":")),
                literal.allSatisfy({ isHexDigit($0) || $0 == 0x3A || $0 == 0x2E })
            else { return nil }
            host = [UInt8(ascii: "[")] + literal.map(asciiLowercased) + [UInt8(ascii: "]")]
            hostBytes = authority[authority.startIndex...close]
            let rest = authority[(close + 1)...]
            if rest.isEmpty {
                portText = rest
            } else {
                guard rest.first == 0x3A else { return nil }
                portText = rest.dropFirst()
            }
        } else {
            let colonInHost = authority.firstIndex(of: UInt8(ascii: ":"))
            let name = authority[..<(colonInHost ?? authority.endIndex)]
            guard !name.isEmpty,
                name.allSatisfy({ isUnreserved($0) || isSubDelim($0) || $0 == 0x25 || $0 >= 0x80 })
            else { return nil }
            hostBytes = name
            if name.contains(where: { (0x41...0x5A).contains($0) }) { host = name.map(asciiLowercased) }
            portText = colonInHost.map { authority[($0 + 1)...] } ?? authority[authority.endIndex...]
        }
        func hostString() -> String {
            host.map { String(decoding: $0, as: UTF8.self) } ?? String(decoding: hostBytes, as: UTF8.self)
        }
        if portText.isEmpty {
            return hostString()
        }
        var port = 0
        for digit in portText {
            guard digit >= 0x30, digit <= 0x39 else { return nil }
            port = port * 10 + Int(digit - 0x30)
            guard port <= 65535 else { return nil }
        }
        if port == defaultPort {
            return hostString()
        }
        if host == nil && (portText.count == 1 || portText.first != 0x30) {
            // "host:port" as written, with the port in its plain spelling
            return String(decoding: bytes[hostBytes.startIndex..<portText.endIndex], as: UTF8.self)
        }
        return hostString() + ":\(port)"
    }

    /// Whether `bytes`, ASCII letters lower-cased, spell `lowercase`.
    private static func lowerCaseEquals(_ bytes: Slice<UnsafeBufferPointer<UInt8>>, _ lowercase: StaticString) -> Bool {
        lowercase.withUTF8Buffer { expected in
            bytes.count == expected.count && zip(bytes, expected).allSatisfy { asciiLowercased($0) == $1 }
        }
    }

    // MARK: - Character classes (RFC 3986 §2)

    static func isUnreserved(_ byte: UInt8) -> Bool {
        switch byte {
        case 0x41...0x5A, 0x61...0x7A, 0x30...0x39: return true  // ALPHA DIGIT
        case 0x2D, 0x2E, 0x5F, 0x7E: return true  // - . _ ~
        default: return false
        }
    }

    static func isSubDelim(_ byte: UInt8) -> Bool {
        switch byte {
        case 0x21, 0x24, 0x26, 0x27, 0x28, 0x29, 0x2A, 0x2B, 0x2C, 0x3B, 0x3D: return true
        default: return false  // ! $ & ' ( ) * + , ; =
        }
    }

    static func isHexDigit(_ byte: UInt8) -> Bool {
        switch byte {
        case 0x30...0x39, 0x41...0x46, 0x61...0x66: return true
        default: return false
        }
    }

    static func asciiLowercased(_ byte: UInt8) -> UInt8 {
        (0x41...0x5A).contains(byte) ? byte + 0x20 : byte
    }
}
