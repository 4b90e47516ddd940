/// The directives of a `Cache-Control` field (RFC 9111 §5.2).
///
/// Grammar: a comma-separated list of `token [ "=" ( token / quoted-string ) ]`.
/// Parsing is lenient where it costs nothing: names are compared case-insensitively
/// (stored lowercased), spaces and tabs around names, `=` and commas are skipped, empty
/// list elements are ignored, a quoted argument may contain commas and backslash escapes,
/// and an unterminated quote runs to the end. Arguments are accepted in both forms for
/// every directive (`max-age="60"` is `max-age=60`), as §5.2 asks of recipients.
/// Unknown directives are kept in ``directives`` and otherwise ignored.
public struct CacheControl: Sendable, Equatable {
    public struct Directive: Sendable, Equatable {
        /// Lowercased.
        public var name: String
        /// The argument with quotes and escapes removed; nil when there is no `=`.
        public var value: String?

        public init(name: String, value: String? = nil) {
            self.name = name
            self.value = value
        }
    }

    /// In the order received.
    public var directives: [Directive]

    /// Parses one field value.
    public init(_ fieldValue: String) {
        directives = Self.parse(Array(fieldValue.utf8))
    }

    /// Parses several field lines as one list (RFC 9110 §5.3: they combine with commas).
    public init(lines: [String]) {
        directives = lines.flatMap { Self.parse(Array($0.utf8)) }
    }

    /// True if the directive `name` (lowercase) is present, with or without an argument.
    public func contains(_ name: String) -> Bool {
        directives.contains { $0.name == name }
    }

    /// The argument of the first directive called `name` (lowercase); nil if absent or
    /// without an argument.
    public func value(_ name: String) -> String? {
        directives.first { $0.name == name }?.value
    }

    public var noStore: Bool { contains("no-store") }
    /// `no-cache`, with or without field names: the qualified form is treated as the
    /// unqualified one (more restrictive, which RFC 9111 §5.2.2.4 allows).
    public var noCache: Bool { contains("no-cache") }
    public var mustRevalidate: Bool { contains("must-revalidate") }
    public var isPrivate: Bool { contains("private") }
    public var isPublic: Bool { contains("public") }

    /// The first `max-age`: its delta-seconds, saturated at 2^31 (RFC 9111 §1.2.2); 0 when
    /// the argument is missing or not a non-negative integer (invalid freshness information
    /// is treated as stale, as §4.2.1 encourages); nil when there is no `max-age`.
    public var maxAge: Int? {
        guard let directive = directives.first(where: { $0.name == "max-age" }) else {
            return nil
        }
        return directive.value.flatMap(Self.deltaSeconds) ?? 0
    }

    /// A non-negative decimal integer, saturated at 2^31; nil for anything else.
    public static func deltaSeconds(_ text: String) -> Int? {
        let limit = 1 << 31
        var value = 0
        var count = 0
        for byte in text.utf8 {
            guard byte >= 48, byte <= 57 else { return nil }
            value = min(limit, value * 10 + Int(byte - 48))
            count += 1
        }
        return count > 0 ? value : nil
    }

    // MARK: - Parsing

    private static func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 }

    private static func parse(_ bytes: [UInt8]) -> [Directive] {
        var result: [Directive] = []
        var i = 0
        let comma = UInt8(ascii: ",")
        let equals = UInt8(ascii: "=")
        let quote = UInt8(ascii: "\"")
        while i < bytes.count {
            while i < bytes.count, isSpace(bytes[i]) || bytes[i] == comma { i += 1 }
            guard i < bytes.count else { break }
            // The name: up to `=`, `,` or whitespace.
            let nameStart = i
            while i < bytes.count, bytes[i] != equals, bytes[i] != comma, !isSpace(bytes[i]) {
                i += 1
            }
            let name = lowercased(bytes[nameStart..<i])
            while i < bytes.count, isSpace(bytes[i]) { i += 1 }
            var value: String?
            if i < bytes.count, bytes[i] == equals {
                i += 1
                while i < bytes.count, isSpace(bytes[i]) { i += 1 }
                if i < bytes.count, bytes[i] == quote {
                    i += 1
                    var unquoted: [UInt8] = []
                    while i < bytes.count, bytes[i] != quote {
                        if bytes[i] == UInt8(ascii: "\\"), i + 1 < bytes.count { i += 1 }
                        unquoted.append(bytes[i])
                        i += 1
                    }
                    i += 1  // the closing quote (or past the end)
                    value = String(decoding: unquoted, as: UTF8.self)
                } else {
                    let valueStart = i
                    while i < bytes.count, bytes[i] != comma, !isSpace(bytes[i]) { i += 1 }
                    value = String(decoding: bytes[valueStart..<min(i, bytes.count)], as: UTF8.self)
                }
            }
            // Anything else up to the next comma is not part of the grammar: skipped.
            while i < bytes.count, bytes[i] != comma { i += 1 }
            if !name.isEmpty { result.append(Directive(name: name, value: value)) }
        }
        return result
    }

    private static func lowercased(_ bytes: ArraySlice<UInt8>) -> String {
        String(decoding: bytes.map { $0 >= 65 && $0 <= 90 ? $0 + 32 : $0 }, as: UTF8.self)
    }
}
