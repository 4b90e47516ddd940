import CJansson

/// A string that is not a valid JSON Pointer (RFC 6901).
public struct JSONPointerError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The text that was rejected.
    public let pointer: String
    /// Why, naming the pointer, e.g. `invalid escape "~2" at byte 3 in JSON pointer "/a~2"`.
    public let message: String

    /// Creates an error.
    public init(pointer: String, message: String) {
        self.pointer = pointer
        self.message = message
    }

    /// The message.
    public var description: String { message }
}

/// A JSON Pointer (RFC 6901): a path of reference tokens selecting one value in a document.
///
/// - `""` selects the whole document; otherwise every token is introduced by `/`, so `"/"`
///   selects the member named `""`.
/// - In a token, `~1` stands for `/` and `~0` for `~` (decoded in that order, so `~01` is
///   the literal `~1`); any other `~` is an error.
/// - On an array a token selects an element only if it is `0` or a decimal number without a
///   leading zero that is in range; `-` (RFC 6901's "past the end") never resolves.
/// - The URI fragment form (`#/a`) is not accepted.
public struct JSONPointer: Sendable, Hashable, CustomStringConvertible {
    /// The decoded reference tokens, outermost first.
    public let tokens: [String]
    /// Per token: UTF-8 bytes (object lookup) and array index, if the token is one.
    private let compiled: [Token]

    private struct Token: Sendable, Hashable {
        let key: [UInt8]
        let index: Int?
    }

    /// The pointer that selects the whole document.
    public static let root = JSONPointer(tokens: [])

    /// Parses the textual form. Throws for text that neither is empty nor starts with `/`,
    /// and for `~` not followed by `0` or `1`.
    public init(_ text: String) throws(JSONPointerError) {
        let bytes = Array(text.utf8)
        if bytes.isEmpty {
            self.init(tokens: [])
            return
        }
        guard bytes[0] == UInt8(ascii: "/") else {
            throw JSONPointerError(
                pointer: text,
                message: "JSON pointer \(Self.quoted(text)) must be empty or start with \"/\"")
        }
        var tokens: [String] = []
        var current: [UInt8] = []
        var i = 1
        while i < bytes.count {
            let byte = bytes[i]
            if byte == UInt8(ascii: "/") {
                tokens.append(String(decoding: current, as: UTF8.self))
                current.removeAll(keepingCapacity: true)
            } else if byte == UInt8(ascii: "~") {
                let next: UInt8? = i + 1 < bytes.count ? bytes[i + 1] : nil
                switch next {
                case UInt8(ascii: "0"): current.append(UInt8(ascii: "~"))
                case UInt8(ascii: "1"): current.append(UInt8(ascii: "/"))
                default:
                    let shown = next.map { "~" + String(decoding: [$0], as: UTF8.self) } ?? "~"
                    throw JSONPointerError(
                        pointer: text,
                        message: "invalid escape \(Self.quoted(shown)) at byte \(i) in JSON "
                            + "pointer \(Self.quoted(text)) (only ~0 and ~1 are allowed)")
                }
                i += 1
            } else {
                current.append(byte)
            }
            i += 1
        }
        tokens.append(String(decoding: current, as: UTF8.self))
        self.init(tokens: tokens)
    }

    /// A pointer made of already-decoded tokens (no escaping needed).
    public init(tokens: [String]) {
        self.tokens = tokens
        self.compiled = tokens.map { token in
            let key = Array(token.utf8)
            return Token(key: key, index: Self.arrayIndex(key))
        }
    }

    /// The textual form, with `~` and `/` escaped; parses back to the same tokens.
    public var description: String {
        var result = ""
        for token in tokens {
            result += "/"
            for character in token.unicodeScalars {
                switch character {
                case "~": result += "~0"
                case "/": result += "~1"
                default: result.unicodeScalars.append(character)
                }
            }
        }
        return result
    }

    /// The value the pointer selects in `document`, or nil if it selects nothing.
    /// The result is borrowed from `document`: valid while `document` is.
    public func resolve(in document: UnsafeMutablePointer<json_t>) -> UnsafeMutablePointer<json_t>? {
        var current = document
        for token in compiled {
            switch jsonType(of: current) {
            case JSON_OBJECT:
                let found = token.key.withUnsafeBufferPointer { key in
                    withJSONKeyChars(key) { json_object_getn(current, $0, $1) }
                }
                guard let found else { return nil }
                current = found
            case JSON_ARRAY:
                guard let index = token.index, index < json_array_size(current),
                    let found = json_array_get(current, index)
                else { return nil }
                current = found
            default:
                return nil
            }
        }
        return current
    }

    /// The value the pointer selects in `document` as a new Swift reference, or nil.
    public func resolve(in document: JSONRef) -> JSONRef? {
        withExtendedLifetime(document) {
            resolve(in: document.pointer).map { JSONRef(borrowed: $0) }
        }
    }

    /// `0`, or digits without a leading zero that fit in Int; anything else (including
    /// `-`) is nil.
    private static func arrayIndex(_ key: [UInt8]) -> Int? {
        guard let first = key.first, first >= UInt8(ascii: "0"), first <= UInt8(ascii: "9")
        else { return nil }
        if first == UInt8(ascii: "0") { return key.count == 1 ? 0 : nil }
        var value = 0
        for byte in key {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            let (times10, o1) = value.multipliedReportingOverflow(by: 10)
            let (sum, o2) = times10.addingReportingOverflow(Int(byte - UInt8(ascii: "0")))
            if o1 || o2 { return nil }
            value = sum
        }
        return value
    }

    static func quoted(_ text: String) -> String {
        var result = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": result += "\\\""
            case "\\": result += "\\\\"
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result + "\""
    }
}
