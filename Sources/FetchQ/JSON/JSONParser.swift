import CFetchQSupport
import CJansson

/// A JSON text that could not be parsed: what went wrong, jansson's message, and where.
///
/// Locations follow jansson's convention so that pre-scan errors and jansson errors read
/// the same: `line` is 1-based, `column` is the 1-based count of UTF-8 characters on that
/// line up to and including the offending one, `position` is the number of bytes read
/// (the offending byte included). They are -1 when unknown.
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Broad classes of parse failure.
    public enum Kind: Sendable, Equatable {
        /// Not JSON: bad token, trailing data, truncated input, raw NUL byte, bad escape.
        case syntax
        /// Containers nested deeper than the limit (`maxDepth`, or jansson's own
        /// compile-time limit ``JSONParser/janssonMaxDepth``).
        case depth
        /// No value at all: zero bytes or only whitespace.
        case empty
        /// The bytes are not valid UTF-8 (overlong, truncated, surrogate, > U+10FFFF).
        case invalidUTF8
        /// Valid JSON that jansson cannot represent: integers outside Int64, reals that
        /// overflow a double, an object key containing `\u0000`.
        case unsupported
        /// jansson could not allocate memory.
        case outOfMemory
    }

    /// The class of failure.
    public let kind: Kind
    /// Human-readable reason (jansson's text for errors jansson found).
    public let message: String
    /// 1-based line, or -1.
    public let line: Int
    /// 1-based column in characters, or -1.
    public let column: Int
    /// Bytes read when the error was found, or -1.
    public let position: Int

    /// Creates an error (mainly for tests and for callers that wrap other parsers).
    public init(kind: Kind, message: String, line: Int, column: Int, position: Int) {
        self.kind = kind
        self.message = message
        self.line = line
        self.column = column
        self.position = position
    }

    /// `"<message> (line L, column C, byte P)"`.
    public var description: String {
        line >= 0
            ? "\(message) (line \(line), column \(column), byte \(position))"
            : message
    }
}

/// Parses JSON text into jansson values, with a nesting limit enforced before jansson runs.
///
/// Accepts any JSON value at the top level (`JSON_DECODE_ANY`) and `\u0000` inside
/// strings (`JSON_ALLOW_NUL`), as RFC 8259 does. Rejects invalid UTF-8, trailing data and
/// raw NUL bytes. Duplicate object keys are accepted; the last one wins (jansson).
public enum JSONParser {
    /// jansson's compile-time nesting limit (`JSON_PARSER_MAX_DEPTH`, 2048 in the Debian
    /// build). A `maxDepth` above it is capped by jansson, still reported as `.depth`.
    public static let janssonMaxDepth = Int(JSON_PARSER_MAX_DEPTH)

    /// Parses `bytes` as one JSON value.
    ///
    /// - Parameters:
    ///   - bytes: the JSON text (UTF-8). Not retained.
    ///   - maxDepth: the deepest allowed nesting of arrays and objects; `[]` has depth 1 and
    ///     a scalar depth 0, so `maxDepth: 0` accepts only scalars. Checked by a linear
    ///     pre-scan (brackets inside strings do not count) before jansson sees the input,
    ///     so a hostile body cannot make jansson recurse; this check comes first, so a
    ///     too-deep text is reported as `.depth` even if it also has a syntax error.
    /// - Returns: a new value (one reference, owned by the returned ``JSONRef``).
    ///
    /// Valid input is built by `fqs_json_build` (C, json_walk.c), which makes the tree
    /// jansson's parser makes, with the same calls, in about a quarter of the instructions;
    /// anything it declines (invalid input, an allocation that failed) goes to
    /// ``parseWithJansson(_:maxDepth:)`` for the value or for jansson's error.
    public static func parse(_ bytes: UnsafeRawBufferPointer, maxDepth: Int) throws(JSONParseError)
        -> JSONRef
    {
        if let base = bytes.baseAddress,
            let built = fqs_json_build(base.assumingMemoryBound(to: UInt8.self), bytes.count, max(0, maxDepth))
        {
            return JSONRef(stealing: built.assumingMemoryBound(to: json_t.self))
        }
        return try parseWithJansson(bytes, maxDepth: maxDepth)
    }

    /// The pre-scan, then jansson's `json_loadb`: what ``parse(_:maxDepth:)`` gives, always
    /// through jansson (the reference the builder is tested against).
    static func parseWithJansson(_ bytes: UnsafeRawBufferPointer, maxDepth: Int) throws(JSONParseError)
        -> JSONRef
    {
        try preScan(bytes, maxDepth: max(0, maxDepth))
        // preScan rejects empty input, so baseAddress is non-nil here.
        let chars = bytes.baseAddress!.assumingMemoryBound(to: CChar.self)
        var error = json_error_t()
        let flags = Int(JSON_DECODE_ANY) | Int(JSON_ALLOW_NUL)
        if let value = JSONRef(owned: json_loadb(chars, bytes.count, flags, &error)) {
            return value
        }
        let kind = failureKind(json_error_code(&error), bytes, maxDepth: maxDepth)
        let said = text(of: error)
        throw JSONParseError(
            kind: kind,
            message: kind != .outOfMemory || json_error_code(&error) == json_error_out_of_memory ? said
                : said.isEmpty ? "out of memory" : "out of memory (jansson: \(said))",
            line: Int(error.line), column: Int(error.column), position: Int(error.position))
    }

    /// What a failed `json_loadb` means. jansson reports some allocations
    /// that failed as syntax errors ("string or '}' expected"): a text the
    /// allocation-free check finds valid failed for want of memory.
    static func failureKind(_ code: json_error_code, _ bytes: UnsafeRawBufferPointer, maxDepth: Int)
        -> JSONParseError.Kind
    {
        let kind = kind(of: code)
        guard kind == .syntax else { return kind }
        return isValid(bytes, maxDepth: maxDepth) ? .outOfMemory : .syntax
    }

    /// Parses the UTF-8 bytes of `text` (see the `UnsafeRawBufferPointer` overload).
    public static func parse(_ text: String, maxDepth: Int) throws(JSONParseError) -> JSONRef {
        var text = text
        let result: Result<JSONRef, JSONParseError> = text.withUTF8 { utf8 in
            Result { () throws(JSONParseError) in
                try parse(UnsafeRawBufferPointer(utf8), maxDepth: maxDepth)
            }
        }
        return try result.get()
    }

    /// Whether `parse(bytes, maxDepth:)` would succeed, found without
    /// building a value (one pass, no allocation: `fqs_json_valid`).
    public static func isValid(_ bytes: UnsafeRawBufferPointer, maxDepth: Int) -> Bool {
        fqs_json_valid(bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count, maxDepth) == 1
    }

    /// Whether `parse(bytes, maxDepth:)` would succeed (see the `UnsafeRawBufferPointer` overload).
    public static func isValid(_ bytes: [UInt8], maxDepth: Int) -> Bool {
        bytes.withUnsafeBytes { isValid($0, maxDepth: maxDepth) }
    }

    /// Parses `bytes` (see the `UnsafeRawBufferPointer` overload).
    public static func parse(_ bytes: [UInt8], maxDepth: Int) throws(JSONParseError) -> JSONRef {
        let result: Result<JSONRef, JSONParseError> = bytes.withUnsafeBytes { raw in
            Result { () throws(JSONParseError) in try parse(raw, maxDepth: maxDepth) }
        }
        return try result.get()
    }

    // MARK: - Pre-scan

    /// One pass over the bytes: rejects nesting deeper than `maxDepth` (outside strings,
    /// honouring backslash escapes), raw NUL bytes (never valid JSON; jansson accepts one
    /// right after a top-level number), and input with no value at all.
    /// The loop is `fqs_json_prescan` (C): about 4x fewer instructions than a Swift byte loop.
    static func preScan(_ bytes: UnsafeRawBufferPointer, maxDepth: Int) throws(JSONParseError) {
        var index = -1
        let code = fqs_json_prescan(
            bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count, maxDepth, &index)
        switch Int(code) {
        case Int(FQS_SCAN_OK):
            return
        case Int(FQS_SCAN_NUL):
            throw located(.syntax, "NUL byte is not allowed in JSON text", at: index, in: bytes)
        case Int(FQS_SCAN_DEPTH):
            throw located(.depth, "maximum nesting depth \(maxDepth) exceeded", at: index, in: bytes)
        default:
            throw located(.empty, "no JSON value (empty input)", at: bytes.count - 1, in: bytes)
        }
    }

    /// An error at byte `index` (or at the start when `index` < 0), located like jansson.
    static func located(
        _ kind: JSONParseError.Kind, _ message: String, at index: Int,
        in bytes: UnsafeRawBufferPointer
    ) -> JSONParseError {
        var line = 1
        var column = 0
        var i = 0
        while i <= index {
            let byte = bytes[i]
            if byte == UInt8(ascii: "\n") {
                line += 1
                column = 0
            } else if byte & 0xC0 != 0x80 {  // not a UTF-8 continuation byte
                column += 1
            }
            i += 1
        }
        return JSONParseError(
            kind: kind, message: message, line: line, column: column, position: index + 1)
    }

    static func kind(of code: json_error_code) -> JSONParseError.Kind {
        switch code {
        case json_error_stack_overflow: return .depth
        case json_error_invalid_utf8: return .invalidUTF8
        case json_error_numeric_overflow, json_error_null_byte_in_key: return .unsupported
        case json_error_out_of_memory: return .outOfMemory
        default: return .syntax
        }
    }

    /// jansson's message: a NUL-terminated string in a fixed array whose last byte holds
    /// the error code.
    static func text(of error: json_error_t) -> String {
        withUnsafeBytes(of: error.text) { raw in
            let usable = raw.prefix(Int(JSON_ERROR_TEXT_LENGTH) - 1)
            let end = usable.firstIndex(of: 0) ?? usable.endIndex
            return String(decoding: usable[..<end], as: UTF8.self)
        }
    }
}
