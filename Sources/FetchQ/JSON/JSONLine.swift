import CJansson

extension JSONRef {
    /// The value as one line of compact JSON text, for line-oriented output
    /// (the CLI's results):
    ///
    /// - a real is written in the shortest form that reads back as the same
    ///   double (Swift's `description`: `0.1`, `1e-07`, `100.0`), where
    ///   jansson's encoder writes 17 significant digits (`0.10000000000000001`);
    /// - U+2028, U+2029 and U+0085 (NEL) are written `\u2028`, `\u2029` and
    ///   `\u0085`: valid JSON either way, but tools that split text into
    ///   lines by Unicode's rules (Python's `splitlines`, older JavaScript)
    ///   would break the line there (the other characters they break at are
    ///   control characters, escaped anyway);
    /// - in strings, `"` and `\` are escaped, control characters too (`\n`,
    ///   `\t`, … or `\u00XX`, NUL included); other text is copied as it is
    ///   (UTF-8), object keys in jansson's order.
    ///
    /// Iterative, so no depth of nesting can exhaust a thread's stack. Nil
    /// for a value nested deeper than `maxDepth`, which only a reference
    /// cycle (jansson's mutators misused) or a value built by hand can be:
    /// a parsed one is at most 2 048 deep.
    public var lineBytes: [UInt8]? { Self.lineBytes(pointer) }

    /// How deep ``lineBytes`` goes before it gives up.
    public static let maxLineDepth = 100_000

    /// ``lineBytes`` of a borrowed `json_t`.
    public static func lineBytes(_ value: UnsafePointer<json_t>) -> [UInt8]? {
        enum Open {
            case array(UnsafeMutablePointer<json_t>, next: Int)
            case object(UnsafeMutablePointer<json_t>, iter: UnsafeMutableRawPointer?, first: Bool)
        }
        var out: [UInt8] = []
        var open: [Open] = []
        var current: UnsafeMutablePointer<json_t>? = UnsafeMutablePointer(mutating: value)
        while true {
            if let v = current {
                current = nil
                switch jsonType(of: v) {
                case JSON_OBJECT:
                    guard open.count < maxLineDepth else { return nil }
                    out.append(UInt8(ascii: "{"))
                    open.append(.object(v, iter: json_object_iter(v), first: true))
                    continue
                case JSON_ARRAY:
                    guard open.count < maxLineDepth else { return nil }
                    out.append(UInt8(ascii: "["))
                    open.append(.array(v, next: 0))
                    continue
                case JSON_STRING:
                    appendString(json_string_value(v), json_string_length(v), to: &out)
                case JSON_INTEGER:
                    out += String(json_integer_value(v)).utf8
                case JSON_REAL:
                    out += json_real_value(v).description.utf8
                case JSON_TRUE: out += "true".utf8
                case JSON_FALSE: out += "false".utf8
                default: out += "null".utf8
                }
            }
            // The value just written ends; go on with its container.
            guard let top = open.popLast() else { return out }
            switch top {
            case .array(let array, let next):
                if next < json_array_size(array) {
                    if next > 0 { out.append(UInt8(ascii: ",")) }
                    open.append(.array(array, next: next + 1))
                    current = json_array_get(array, next)
                } else {
                    out.append(UInt8(ascii: "]"))
                }
            case .object(let object, let iter, let first):
                guard let iter else {
                    out.append(UInt8(ascii: "}"))
                    continue
                }
                if !first { out.append(UInt8(ascii: ",")) }
                appendString(json_object_iter_key(iter), json_object_iter_key_len(iter), to: &out)
                out.append(UInt8(ascii: ":"))
                open.append(.object(object, iter: json_object_iter_next(object, iter), first: false))
                current = json_object_iter_value(iter)
            }
        }
    }

    /// A JSON string literal of `count` bytes at `bytes` (UTF-8).
    private static func appendString(_ bytes: UnsafePointer<CChar>?, _ count: Int, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        guard let bytes, count > 0 else {
            out.append(UInt8(ascii: "\""))
            return
        }
        let text = UnsafeRawBufferPointer(start: bytes, count: count)
        var i = 0
        while i < count {
            let byte = text[i]
            switch byte {
            case UInt8(ascii: "\""): out += "\\\"".utf8
            case UInt8(ascii: "\\"): out += "\\\\".utf8
            case 0x0A: out += "\\n".utf8
            case 0x0D: out += "\\r".utf8
            case 0x09: out += "\\t".utf8
            case 0x08: out += "\\b".utf8
            case 0x0C: out += "\\f".utf8
            case 0x00..<0x20:
                out += "\\u00".utf8
                out.append(hexDigit(byte >> 4))
                out.append(hexDigit(byte & 0x0F))
            case 0xE2 where i + 2 < count && text[i + 1] == 0x80 && (text[i + 2] == 0xA8 || text[i + 2] == 0xA9):
                out += (text[i + 2] == 0xA8 ? "\\u2028" : "\\u2029").utf8
                i += 2
            case 0xC2 where i + 1 < count && text[i + 1] == 0x85:  // U+0085 (NEL)
                out += "\\u0085".utf8
                i += 1
            default: out.append(byte)
            }
            i += 1
        }
        out.append(UInt8(ascii: "\""))
    }

    private static func hexDigit(_ nibble: UInt8) -> UInt8 {
        nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "a") + nibble - 10
    }
}
