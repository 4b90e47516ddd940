@testable import FetchQ
import Testing

/// `JSONParser.preScan` (the C loop `fqs_json_prescan`) against the Swift loop
/// it replaced, kept here as the reference: same verdict, same location.
@Suite struct JSONPreScanTests {
    /// The Swift pre-scan as it was before the C version: nil when the input
    /// passes, else (kind, byte index).
    static func reference(_ bytes: [UInt8], maxDepth: Int) -> (JSONParseError.Kind, Int)? {
        var depth = 0
        var inString = false
        var escaped = false
        var sawValue = false
        for (index, byte) in bytes.enumerated() {
            if byte == 0 { return (.syntax, index) }
            if inString {
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
            } else {
                switch byte {
                case UInt8(ascii: "["), UInt8(ascii: "{"):
                    depth += 1
                    sawValue = true
                    if depth > maxDepth { return (.depth, index) }
                case UInt8(ascii: "]"), UInt8(ascii: "}"):
                    depth -= 1
                    sawValue = true
                case UInt8(ascii: "\""):
                    inString = true
                    sawValue = true
                case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"):
                    break
                default:
                    sawValue = true
                }
            }
        }
        return sawValue ? nil : (.empty, bytes.count - 1)
    }

    static func scan(_ bytes: [UInt8], maxDepth: Int) -> JSONParseError? {
        bytes.withUnsafeBytes { raw -> JSONParseError? in
            do throws(JSONParseError) {
                try JSONParser.preScan(raw, maxDepth: maxDepth)
                return nil
            } catch {
                return error
            }
        }
    }

    static func check(_ bytes: [UInt8], maxDepth: Int) {
        let expected = reference(bytes, maxDepth: maxDepth)
        let got = scan(bytes, maxDepth: maxDepth)
        #expect(got?.kind == expected?.0, "\(bytes) maxDepth \(maxDepth)")
        if let got, let expected {
            // position is the 1-based count of bytes read, the offending one included.
            #expect(got.position == expected.1 + 1, "\(bytes) maxDepth \(maxDepth)")
            let again = bytes.withUnsafeBytes { JSONParser.located(expected.0, "", at: expected.1, in: $0) }
            #expect(got.line == again.line && got.column == again.column)
        }
    }

    @Test func edgeCases() {
        let cases: [String] = [
            "", " ", " \t\r\n ", "1", "[]", "[[]]", "{\"a\":[1,{\"b\":2}]}", "\"[[[[\"", "\"\\\"[[\"",
            "\"\\\\\"[[", "[\"]\"]", "\"unterminated [[", "\"ends in backslash \\", "]]]]", "[[[]",
            "\n\n  [[[1]]]", "\"é[ü\" [[", "x",
        ]
        for text in cases {
            for maxDepth in [-1, 0, 1, 2, 3, 64] { Self.check(Array(text.utf8), maxDepth: maxDepth) }
        }
        for bytes: [UInt8] in [[0], [0x31, 0], [0x22, 0x5C, 0], [0x22, 0x61, 0, 0x22], [0x5B, 0, 0x5D], [0x20, 0]] {
            for maxDepth in [0, 1, 64] { Self.check(bytes, maxDepth: maxDepth) }
        }
    }

    @Test func largeInputsAgreeWithTheSwiftLoop() {
        func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }
        let flat = "[" + Array(repeating: "1", count: 3000).joined(separator: ",") + "]"
        let inString = "\"" + String(repeating: "{[", count: 3000) + "\""
        func nested(_ depth: Int) -> String {
            String(repeating: "[ ", count: depth) + String(repeating: "] ", count: depth) + String(repeating: " ", count: 5000)
        }
        var withNul = bytes(flat)
        withNul[5000] = 0
        let cases: [([UInt8], Int)] = [
            (bytes(flat), 1), (bytes(flat), 0), (bytes(inString), 10), (bytes(inString), 0),
            (bytes(nested(300)), 300), (bytes(nested(301)), 300), (bytes(nested(4200)), 4200),
            (bytes(nested(4200)), 4199), (withNul, 64), (bytes(String(repeating: " ", count: 9000)), 5),
        ]
        for (input, maxDepth) in cases { Self.check(input, maxDepth: maxDepth) }
        #expect(Self.scan(bytes(nested(301)), maxDepth: 300)?.kind == .depth)
        #expect(Self.scan(withNul, maxDepth: 64)?.position == 5001)
    }

    @Test func randomInputsAgreeWithTheSwiftLoop() {
        // Deterministic: a small LCG over an alphabet heavy in the bytes that matter.
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        func next() -> UInt64 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return state >> 33
        }
        let alphabet: [UInt8] = Array("[]{}\"\\ \t\n\r:,a1é".utf8) + [0, 0x80, 0xFF]
        for round in 0..<20_000 {
            // Mostly short inputs; every tenth up to 400 bytes, so both the quick
            // bracket count and the exact scan decide some of them.
            let length = round % 10 == 0 ? Int(next() % 400) : Int(next() % 24)
            var bytes: [UInt8] = []
            for _ in 0..<length {
                // NUL rarely, so most inputs get past it.
                var byte = alphabet[Int(next() % UInt64(alphabet.count))]
                if byte == 0 && next() % 8 != 0 { byte = UInt8(ascii: "x") }
                bytes.append(byte)
            }
            Self.check(bytes, maxDepth: round % 10 == 0 ? Int(next() % 40) : Int(next() % 5) - 1)
        }
    }
}
