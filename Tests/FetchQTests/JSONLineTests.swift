import CJansson
@testable import FetchQ
import Testing

/// `JSONRef.lineBytes`: the CLI's result lines.
@Suite struct JSONLineTests {
    func line(_ text: String) throws -> String {
        let value = try JSONParser.parse(text, maxDepth: 2048)
        return String(decoding: try #require(value.lineBytes), as: UTF8.self)
    }

    /// Reads `bytes` back with jansson's own parser (NUL in strings allowed).
    func janssonReads(_ bytes: [UInt8]) -> JSONRef? {
        bytes.withUnsafeBufferPointer { buffer in
            buffer.baseAddress!.withMemoryRebound(to: CChar.self, capacity: buffer.count) {
                JSONRef(owned: json_loadb($0, buffer.count, Int(JSON_DECODE_ANY | JSON_ALLOW_NUL), nil))
            }
        }
    }

    @Test func writesCompactJSONWithShortestReals() throws {
        #expect(try line(#"{"a": 0.1, "b": [1, 2.5, -0.0, 1e-7, 1e300, 123456789.125, 100.0, -17], "c": {}, "d": [], "e": null, "f": true, "g": false}"#)
                == #"{"a":0.1,"b":[1,2.5,-0.0,1e-07,1e+300,123456789.125,100.0,-17],"c":{},"d":[],"e":null,"f":true,"g":false}"#)
        // jansson's encoder: 17 significant digits
        let tenth = try JSONParser.parse("0.1", maxDepth: 8)
        #expect(tenth.dumps() == "0.10000000000000001")
        #expect(try line("0.1") == "0.1")
        #expect(try line("[5e-324, 1.7976931348623157e308, 0.30000000000000004]")
                == "[5e-324,1.7976931348623157e+308,0.30000000000000004]")
        #expect(try line("9223372036854775807") == "9223372036854775807")
        #expect(try line("-9223372036854775808") == "-9223372036854775808")
    }

    @Test func escapesWhatAStringMustAndLineSeparators() throws {
        #expect(try line(#"["q\"b\\s/ \u0000\u0001\u001f\b\f\n\r\t\u007f é \u2028 \u2029 😀"]"#)
                == "[\"q\\\"b\\\\s/ \\u0000\\u0001\\u001f\\b\\f\\n\\r\\t\u{7f} é \\u2028 \\u2029 😀\"]")
        #expect(try line(#"{"k\u2028\"ey": "", "": 1}"#) == #"{"k\u2028\"ey":"","":1}"#)
        #expect(try line(#"["a\u0085b\u0084"]"#) == "[\"a\\u0085b\u{84}\"]")  // NEL breaks lines too
        // U+2028's bytes in other sequences are other characters: copied
        #expect(try line(#""\u2027\u202a\u0828""#) == "\"\u{2027}\u{202a}\u{0828}\"")
    }

    @Test func randomValuesReadBackEqual() throws {
        var rng = SplitMix(seed: 42)
        let alphabet: [Unicode.Scalar] = ["a", "\"", "\\", "\n", "\u{0}", "\u{1f}", "\u{7f}", "é", "\u{2028}",
                                          "\u{2029}", "\u{2027}", "\u{85}", "😀", "/", " ", "{", "]"]
        func string(key: Bool = false) -> String {
            var s = String.UnicodeScalarView()
            for _ in 0..<Int(rng.next() % 8) {
                let c = alphabet[Int(rng.next() % UInt64(alphabet.count))]
                // (a key with NUL can be built, but no parser reads one back)
                if !(key && c == "\u{0}") { s.append(c) }
            }
            return String(s)
        }
        func value(_ depth: Int) -> JSONRef {
            switch rng.next() % (depth > 4 ? 5 : 7) {
            case 0: return .integer(Int64(bitPattern: rng.next()) >> Int64(rng.next() % 64))
            case 1:
                var d = Double(bitPattern: rng.next())
                if !d.isFinite { d = Double(rng.next() % 1000) / 7 }
                return JSONRef(owned: json_real(d))!
            case 2: return .string(string())
            case 3: return JSONRef(owned: rng.next() % 3 == 0 ? json_null() : rng.next() % 2 == 0 ? json_true() : json_false())!
            case 4: return .integer(Int64(rng.next() % 10))
            case 5:
                let a = JSONRef.array()
                for _ in 0..<Int(rng.next() % 5) { a.append(value(depth + 1)) }
                return a
            default:
                let o = JSONRef.object()
                for _ in 0..<Int(rng.next() % 5) { o.set(string(key: true), value(depth + 1)) }
                return o
            }
        }
        var reals = 0
        for _ in 0..<3_000 {
            let v = value(0)
            let bytes = try #require(v.lineBytes)
            // no character any line splitter breaks at (Character.isNewline:
            // \n, \r, \u{b}, \u{c}, U+0085, U+2028, U+2029)
            #expect(!bytes.contains(0x00) && !String(decoding: bytes, as: UTF8.self).contains(where: \.isNewline))
            let back = try #require(janssonReads(bytes), "\(String(decoding: bytes, as: UTF8.self))")
            #expect(back.isEqual(to: v), "\(String(decoding: bytes, as: UTF8.self))")
            let ours = try JSONParser.parse(String(decoding: bytes, as: UTF8.self), maxDepth: 2048)
            #expect(ours.isEqual(to: v))
            if jsonType(of: v.pointer) == JSON_REAL {
                reals += 1  // the same double, to the bit (json_equal says 0.0 == -0.0)
                #expect(json_real_value(back.pointer).bitPattern == json_real_value(v.pointer).bitPattern)
            }
        }
        #expect(reals > 200)
    }

    @Test func deepNestingNeedsNoStackAndACycleEnds() throws {
        // 100 000 levels: past a small thread's stack for a recursive encoder
        let outer = JSONRef.array()
        var inner = outer
        for _ in 1..<JSONRef.maxLineDepth {
            let next = JSONRef.array()
            inner.append(next)
            inner = next
        }
        let bytes = try #require(outer.lineBytes)
        #expect(bytes.count == 2 * JSONRef.maxLineDepth)
        #expect(bytes.prefix(3) == [0x5B, 0x5B, 0x5B] && bytes.suffix(3) == [0x5D, 0x5D, 0x5D])
        inner.append(.array())  // one more: past the bound
        #expect(outer.lineBytes == nil)
        // A cycle (jansson's mutators misused) ends too, with nil.
        let loop = JSONRef.array(), back = JSONRef.array()
        loop.append(back)
        #expect(json_array_append(back.pointer, loop.pointer) == 0)
        #expect(loop.lineBytes == nil)
        json_array_clear(back.pointer)  // (so that both can be freed)
    }
}
