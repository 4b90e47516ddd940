import CFetchQSupport
import CJansson
import Glibc
import Testing

@testable import FetchQ

/// `fqs_json_valid` (C, Sources/CFetchQSupport/json_walk.c) against the real thing:
/// for every input, the validator says 1 exactly when `JSONParser.parseWithJansson`
/// (pre-scan plus jansson's `json_loadb`) succeeds.
@Suite struct JSONValidatorTests {

    // MARK: - Helpers

    static func validator(_ bytes: [UInt8], maxDepth: Int) -> Bool {
        bytes.withUnsafeBufferPointer { fqs_json_valid($0.baseAddress, $0.count, maxDepth) } == 1
    }

    /// The verdict of the walk that also writes marshal's format
    /// (`fqs_json_marshal`), which must be the validator's; `written` when
    /// it wrote the value (only ever for valid input).
    static func marshalWalk(_ bytes: [UInt8], maxDepth: Int) -> (valid: Bool, written: Bool) {
        var out: UnsafeMutablePointer<UInt8>? = nil
        var count = 0
        let valid = bytes.withUnsafeBufferPointer {
            fqs_json_marshal($0.baseAddress, $0.count, maxDepth, &out, &count)
        } == 1
        free(out)
        return (valid, out != nil)
    }

    /// jansson's verdict (`JSONParser.parse` itself builds valid input with
    /// `fqs_json_build`, which asks this validator first).
    static func parser(_ bytes: [UInt8], maxDepth: Int) -> Bool {
        bytes.withUnsafeBytes { (try? JSONParser.parseWithJansson($0, maxDepth: maxDepth)) != nil }
    }

    static func hex(_ bytes: [UInt8], limit: Int = 400) -> String {
        let digits = Array("0123456789abcdef")
        var text = ""
        for byte in bytes.prefix(limit) {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 15)])
        }
        return bytes.count > limit ? text + "... (\(bytes.count) bytes)" : text
    }

    /// Compares the two answers; records an issue (with the input in hex) on a mismatch.
    /// Returns the parser's answer, or nil on a mismatch.
    @discardableResult
    static func agree(
        _ bytes: [UInt8], maxDepth: Int, _ label: String = "",
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> Bool? {
        let expected = parser(bytes, maxDepth: maxDepth)
        let actual = validator(bytes, maxDepth: maxDepth)
        if actual != expected {
            Issue.record(
                "mismatch \(label) maxDepth \(maxDepth): validator \(actual), parse \(expected), input hex \(hex(bytes))",
                sourceLocation: sourceLocation)
            return nil
        }
        return expected
    }

    /// A string literal's UTF-8 bytes.
    static func u(_ text: String) -> [UInt8] { Array(text.utf8) }

    /// `raw` between double quotes: a JSON string with the given body bytes.
    static func quoted(_ raw: [UInt8]) -> [UInt8] { [0x22] + raw + [0x22] }

    /// 2^1024 - 2^970, halfway between DBL_MAX and 2^1024: the smallest magnitude strtod
    /// overflows on (ties round to even, which is 2^1024 here).
    static let threshold =
        "17976931348623158079372897140530341507993413271003782693617377898044496829276475094664"
        + "90179775872070963302864166928879109465555478519404026306574886715058206819089020007083"
        + "83676273854845817711531764475730270069855571366959622842914819860834936475292719074168"
        + "444365510704342711559699508093042880177904174497792"
    /// The threshold minus one (last digit 2 -> 1).
    static let belowThreshold = String(threshold.dropLast()) + "1"

    static let depths = [3, 512, 1_000_000]

    /// The suite's test_parsing files, then test_transform's (a sibling directory) if it
    /// is there, as (name, bytes).
    static func suiteFiles() throws -> [(String, [UInt8])] {
        let parsing = try JSONSuiteFiles.directory()
        let transform = String(parsing.dropLast("test_parsing".count)) + "test_transform"
        var directories = [parsing]
        var info = stat()
        if stat(transform, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR {
            directories.append(transform)
        }
        var files: [(String, [UInt8])] = []
        for directory in directories {
            for name in try JSONSuiteFiles.jsonFiles(in: directory) {
                let bytes = try #require(
                    JSONSuiteFiles.read(directory + "/" + name), "cannot read \(name)")
                files.append((name, bytes))
            }
        }
        return files
    }

    @Test func janssonDepthLimitMatchesHeader() {
        #expect(Int(FQS_JANSSON_MAX_DEPTH) == Int(JSON_PARSER_MAX_DEPTH))
        #expect(JSONParser.janssonMaxDepth == 2048)
    }

    // MARK: - JSONTestSuite

    @Test(arguments: depths) func everySuiteFileAgrees(maxDepth: Int) throws {
        let files = try Self.suiteFiles()
        var accepted = 0
        var yes = 0
        var no = 0
        for (name, bytes) in files {
            guard let parsed = Self.agree(bytes, maxDepth: maxDepth, name) else { continue }
            if parsed { accepted += 1 }
            // The marshal walk: the same verdict, and (none of these nests past
            // its 500 levels) the value written for every valid file.
            let marshal = Self.marshalWalk(bytes, maxDepth: maxDepth)
            #expect(marshal.valid == parsed && marshal.written == parsed, "\(name): marshal walk \(marshal)")
            // Spot-check the verdicts themselves (the deep i_ file and the NUL key aside).
            if name.hasPrefix("y_") && name != "y_object_escaped_null_in_key.json" && maxDepth >= 512 {
                #expect(parsed, "\(name) should be valid")
                yes += 1
            }
            if name.hasPrefix("n_") {
                #expect(!parsed, "\(name) should be invalid")
                no += 1
            }
        }
        #expect(files.count == 318 + 22)  // test_parsing + test_transform
        #expect(no == 188)
        #expect(yes == (maxDepth >= 512 ? 94 : 0))
        #expect(accepted > (maxDepth >= 512 ? 100 : 50))
    }

    // MARK: - Hand-written cases

    /// (input, accepted at maxDepth 512). Every case is also compared with the parser at
    /// several depths, so the expected verdicts are checked twice.
    static let scalarCases: [([UInt8], Bool)] = {
        let T = threshold
        let B = belowThreshold
        let zeros1000 = String(repeating: "0", count: 1000)
        var cases: [([UInt8], Bool)] = [
            // Integers: strtoll, ERANGE outside int64.
            (u("9223372036854775807"), true), (u("9223372036854775808"), false),
            (u("-9223372036854775808"), true), (u("-9223372036854775809"), false),
            (u("9999999999999999999"), false), (u("1000000000000000000"), true),
            (u("999999999999999999"), true), (u("-999999999999999999"), true),
            (u("10000000000000000000"), false), (u("-10000000000000000000"), false),
            (u(String(repeating: "9", count: 400)), false),
            (u("-0"), true), (u("0"), true), (u("-0.0"), true), (u("-0e-0"), true), (u("0E+0"), true),
            // Reals: strtod, only overflow to +-HUGE_VAL is an error.
            (u("1e308"), true), (u("1.8e308"), false), (u("1e309"), false), (u("-1e309"), false),
            (u("1e-400"), true), (u("-1e-400"), true), (u("4.9e-324"), true), (u("2e-324"), true),
            (u("1.7976931348623157e308"), true), (u("1.7976931348623158e308"), true),
            (u("1.7976931348623159e308"), false), (u("-1.7976931348623159e308"), false),
            (u("1.797693134862315807937289714054e308"), false),
            (u("1.797693134862315807937289714053e308"), true),
            (u("0e99999999999"), true), (u("0.000e99999999999999999999999"), true),
            (u("1e99999999999999999999999"), false), (u("1e-99999999999999999999999"), true),
            (u("1e2147483648"), false), (u("2e-2147483649"), true),
            (u("1E+2"), true), (u("1e+2"), true), (u("1E-2"), true), (u("1e0001"), true),
            (u("0.0000000000000000000000000000000000001e345"), true),
            (u("0.0000000000000000000000000000000000001e346"), false),
            // The exact overflow threshold, in several spellings.
            (u(T + ".0"), false), (u(B + ".0"), true), (u("-" + T + ".0"), false), (u("-" + B + ".0"), true),
            (u(T + "e0"), false), (u(B + "e0"), true),
            (u(B + "." + String(repeating: "9", count: 500)), true),
            (u(T + "." + String(repeating: "0", count: 500) + "1"), false),
            (u(T + String(repeating: "0", count: 91) + "e-91"), false),
            (u(B + String(repeating: "9", count: 100) + "e-100"), true),
            (u("0." + T + "e309"), false), (u("0." + B + "e309"), true),
            (u("0.000" + T + "e312"), false), (u("0.000" + B + "e312"), true),
            (u(String(T.prefix(1)) + "." + T.dropFirst() + "e308"), false),
            (u(String(B.prefix(1)) + "." + B.dropFirst() + "e308"), true),
            (u(String(B.prefix(100)) + "." + B.dropFirst(100) + "e209"), true),
            (u(String(T.prefix(100)) + "." + T.dropFirst(100) + "e209"), false),
            // Long mantissas (1001 digits) with large and small exponents.
            (u("1" + zeros1000 + "e-692"), true), (u("1" + zeros1000 + "e-691"), false),
            (u("1" + zeros1000 + "e-1400"), true), (u("1" + zeros1000 + "e99999"), false),
            (u("0." + zeros1000 + "1e1309"), true), (u("0." + zeros1000 + "1e1310"), false),
            (u("0." + zeros1000 + "e99999"), true),
            (u("1." + String(repeating: "8", count: 1000) + "e308"), false),
            (u("1." + String(repeating: "5", count: 1000) + "e308"), true),
            (u("1." + String(repeating: "5", count: 1000) + "e307"), true),
            // Number grammar.
            (u("01"), false), (u("-01"), false), (u("00"), false), (u("-00.5"), false), (u("+1"), false),
            (u("1."), false), (u("1.e5"), false), (u(".5"), false), (u("1e"), false), (u("1e+"), false),
            (u("-"), false), (u("--1"), false), (u("1.0e+"), false), (u("0x10"), false), (u("1.5.2"), false),
            (u("Infinity"), false), (u("NaN"), false), (u("-Infinity"), false), (u("1 2"), false),
            // Escapes and surrogates.
            (u(#""\ud800\udc00""#), true), (u(#""\uDBFF\uDFFF""#), true), (u(#""\uD834\uDD1E""#), true),
            (u(#""\ud800""#), false), (u(#""\udc00""#), false), (u(#""\udfff""#), false),
            (u(#""\udc00\ud800""#), false), (u(#""\ud800\u0041""#), false), (u(#""\ud800x""#), false),
            (u(#""\ud800\ud800\udc00""#), false), (u(#""\ud800\\udc00""#), false), (u(#""\ud800\u""#), false),
            (u(#""\ud800\udc0""#), false), (u(#""\ud800\udcxx""#), false),
            (u(#""\u00e9\u00E9\uAbCd""#), true), (u(#""\u12""#), false), (u(#""\u12g4""#), false),
            (u(#""\x41""#), false), (u(#""\U0041""#), false), (u(#""\'""#), false), (u(#""\a""#), false),
            (u(#""\"\\\/\b\f\n\r\t""#), true), (u(#""\""#), false), (u("\""), false), (u(#""abc"#), false),
            // \u0000: fine in values, rejected in keys (jansson json_error_null_byte_in_key).
            (u(#""\u0000""#), true), (u(#"["a\u0000b"]"#), true), (u(#"{"a":"\u0000"}"#), true),
            (u(#"{"a\u0000":1}"#), false), (u(#"{"\u0000":1}"#), false),
            (u(#"[{"x":{"\u0000":1}}]"#), false), (u(#"{"a":{"b":{"c\u0000d":[]}}}"#), false),
            (u(#"{"ok":1,"\u0000":2}"#), false), (u(#"{"\u0001":1}"#), true), (u(#"{"\u0100":1}"#), true),
            (u(#"{"\ud800\udc00":1}"#), true), (u(#"{"a":1,"a":2}"#), true),
            // UTF-8: strict, checked byte by byte.
            (quoted([0xC3, 0xA9]), true), (quoted([0xC0, 0x80]), false), (quoted([0xC1, 0xBF]), false),
            (quoted([0xC2, 0x80]), true), (quoted([0xDF, 0xBF]), true),
            (quoted([0xE0, 0x80, 0xAF]), false), (quoted([0xE0, 0x9F, 0xBF]), false),
            (quoted([0xE0, 0xA0, 0x80]), true), (quoted([0xEF, 0xBF, 0xBF]), true),
            (quoted([0xF0, 0x80, 0x80, 0xAF]), false), (quoted([0xF0, 0x8F, 0xBF, 0xBF]), false),
            (quoted([0xF0, 0x90, 0x80, 0x80]), true), (quoted([0xF4, 0x8F, 0xBF, 0xBF]), true),
            (quoted([0xF4, 0x90, 0x80, 0x80]), false), (quoted([0xF5, 0x80, 0x80, 0x80]), false),
            (quoted([0xF7, 0xBF, 0xBF, 0xBF]), false), (quoted([0xF8, 0x88, 0x80, 0x80, 0x80]), false),
            (quoted([0xED, 0xA0, 0x80]), false), (quoted([0xED, 0xBF, 0xBF]), false),
            (quoted([0xED, 0xA0, 0xBD, 0xED, 0xB8, 0x80]), false),
            (quoted([0xED, 0x9F, 0xBF]), true), (quoted([0xEE, 0x80, 0x80]), true),
            (quoted([0x80]), false), (quoted([0xBF]), false), (quoted([0xFE]), false), (quoted([0xFF]), false),
            (quoted([0xE2, 0x82]), false), (quoted([0xF0, 0x9F, 0x98]), false), (quoted([0xC3, 0x41]), false),
            ([0x22, 0xE2, 0x82], false), ([0x22, 0xC3], false), ([0x22, 0xF0, 0x9F, 0x98, 0x80], false),
            (quoted([0xF0, 0x9F, 0x98, 0x80]), true),
            (quoted(Array(repeating: 0xC3, count: 40) + [0xA9]), false),
            (quoted(Array(repeating: 0x61, count: 40) + [0xE2, 0x82, 0xAC] + Array(repeating: 0x62, count: 40)), true),
            // BOM: fine inside a string, not before the value.
            ([0xEF, 0xBB, 0xBF] + u("1"), false), ([0xEF, 0xBB, 0xBF] + u("{}"), false),
            (quoted([0xEF, 0xBB, 0xBF]), true),
            // Control characters and NUL.
            (quoted([0x1F]), false), (quoted([0x09]), false), (quoted([0x0A]), false), (quoted([0x7F]), true),
            (quoted([0x00]), false), ([0x00], false), (u("1") + [0x00], false), (u("[1]") + [0x00], false),
            ([0x00] + u("1"), false), (u("[1,") + [0x00] + u("2]"), false), (u("\"a\\") + [0x00] + u("\""), false),
            // Literals.
            (u("true"), true), (u("false"), true), (u("null"), true), (u("True"), false), (u("tru"), false),
            (u("truex"), false), (u("nul"), false), (u("nulll"), false), (u("falsetrue"), false),
            (u("[true,false,null]"), true), (u("[true false]"), false), (u("[nul]"), false),
            // Whitespace, empty input, trailing data.
            (u(""), false), (u(" "), false), (u("\t\r\n "), false), (u("\n"), false),
            (u(" 1 "), true), (u("\t\r\n[ 1 , 2 ]\n"), true), (u("1 \t\r\n"), true),
            ([0x0C] + u("1"), false), (u("1") + [0x0C], false), (u("1") + [0x0B], false),
            ([0xC2, 0xA0] + u("1"), false), (u("1") + [0xC2, 0xA0], false),
            (u("[]x"), false), (u("{}{}"), false), (u("[]]"), false), (u("[] []"), false),
            (u("\"a\" \"b\""), false), (u("1,"), false), (u("1 x"), false), (u("[1]/"), false),
            // Structure.
            (u("[1,]"), false), (u("[,1]"), false), (u("[,]"), false), (u("[1,,2]"), false), (u("[1 2]"), false),
            (u("{\"a\":1,}"), false), (u("{,}"), false), (u("{\"a\"}"), false), (u("{\"a\":}"), false),
            (u("{:1}"), false), (u("{1:1}"), false), (u("{a:1}"), false), (u("[\"a\":1]"), false),
            (u("{\"a\" 1}"), false), (u("{\"a\"::1}"), false), (u("{\"a\":1 \"b\":2}"), false),
            (u("[}"), false), (u("{]"), false), (u("["), false), (u("{"), false), (u("]"), false),
            (u("[{}]"), true), (u("[[],{},\"\",0]"), true), (u("{\"a\":[{\"b\":{}}],\"c\":-1.5E-3}"), true),
            // Brackets inside strings do not count as nesting.
            (u("[\"" + String(repeating: "[", count: 5000) + "\"]"), true),
            (u("{\"[[[[\":\"{{{{\"}"), true), (u("[\"\\\"[[[\\\\\"]"), true),
        ]
        // Long strings (the 16-byte skip, with a special byte at every offset).
        for offset in 0..<40 {
            var body = Array(repeating: UInt8(ascii: "x"), count: 40)
            body[offset] = 0x1F
            cases.append((quoted(body), false))
            body[offset] = UInt8(ascii: "\\")
            cases.append((quoted(body), false))  // "\x" is not an escape
            body[offset] = 0xC3
            cases.append((quoted(body), false))  // followed by "x": a bad continuation
            body[offset] = UInt8(ascii: "\"")
            cases.append((quoted(body), false))  // a stray quote in the middle
            body[offset] = 0x7F
            cases.append((quoted(body), true))
        }
        return cases
    }()

    @Test func handWrittenCases() {
        var checked = 0
        for (bytes, expected) in Self.scalarCases {
            #expect(
                Self.validator(bytes, maxDepth: 512) == expected,
                "validator on \(Self.hex(bytes)): expected \(expected)")
            #expect(
                Self.parser(bytes, maxDepth: 512) == expected,
                "parse on \(Self.hex(bytes)): expected \(expected)")
            for maxDepth in [-1, 0, 1, 3, 512, 1_000_000] {
                Self.agree(bytes, maxDepth: maxDepth)
                checked += 1
            }
        }
        #expect(Self.scalarCases.count == 434)
        #expect(checked == Self.scalarCases.count * 6)
    }

    // MARK: - Depth

    /// `open` x n, `inner`, `close` x n.
    static func nested(_ n: Int, _ open: String, _ inner: String, _ close: String) -> [UInt8] {
        u(String(repeating: open, count: n) + inner + String(repeating: close, count: n))
    }

    /// (input, maxDepth, accepted): both limits at, below and past the boundary.
    static let depthCases: [([UInt8], Int, Bool)] = {
        var cases: [([UInt8], Int, Bool)] = []
        // The engine limit: a `[` or `{` opening level maxDepth + 1 fails, scalars never count.
        for limit in [0, 1, 2, 3, 17, 512, 2047, 2048] {
            for n in Set([max(0, limit - 1), limit, limit + 1]) {
                cases.append((nested(n, "[", "", "]"), limit, n >= 1 && n <= limit))  // n = 0: empty input
                cases.append((nested(n, "[", "1", "]"), limit, n <= limit && n < 2048))
                cases.append((nested(n, "{\"k\":", "\"v\"", "}"), limit, n <= limit && n < 2048))
                cases.append((nested(n, "[{\"k\":", "[]", "}]"), limit, 2 * n + 1 <= limit))
            }
        }
        // Negative maxDepth: JSONParser treats it as 0 (scalars only).
        cases += [(u("1"), -1, true), (u("\"[\""), -5, true), (u("[]"), -1, false), (u("{}"), Int.min, false)]
        // jansson's own limit: it counts every value (the top-level one has depth 1) and
        // fails past 2048, so 2048 nested containers parse only if the innermost is empty.
        let big = 1_000_000
        cases += [
            (nested(2047, "[", "", "]"), big, true), (nested(2048, "[", "", "]"), big, true),
            (nested(2049, "[", "", "]"), big, false), (nested(2047, "[", "1", "]"), big, true),
            (nested(2048, "[", "1", "]"), big, false), (nested(2048, "[", "\"\"", "]"), big, false),
            (nested(2048, "[", "true", "]"), big, false), (nested(2047, "[", "[1]", "]"), big, false),
            (nested(2047, "{\"a\":", "1", "}"), big, true), (nested(2048, "{\"a\":", "1", "}"), big, false),
            (nested(2047, "{\"a\":", "{}", "}"), big, true), (nested(2048, "{\"a\":", "{}", "}"), big, false),
            (nested(1024, "[{\"a\":", "", "}]"), big, false),  // a key with no value: syntax
            (nested(1023, "[{\"a\":", "[]", "}]"), big, true), (nested(1024, "[{\"a\":", "[]", "}]"), big, false),
            (nested(2047, "[", "[],[1]", "]"), big, false), (nested(2047, "[", "[],1", "]"), big, true),
            (nested(2048, "[", "", "]"), 2048, true), (nested(2048, "[", "", "]"), 2047, false),
            (nested(5000, "[", "", "]"), big, false), (u(String(repeating: "[", count: 5000)), big, false),
            // Brackets in strings at the limit: not counted.
            (nested(3, "[", "\"[[[[{{{{\"", "]"), 3, true), (nested(3, "[", "\"\\\"[[\"", "]"), 3, true),
        ]
        return cases
    }()

    @Test func depthCases() {
        for (bytes, maxDepth, expected) in Self.depthCases {
            let prefix = Self.hex(Array(bytes.prefix(24)))
            #expect(
                Self.validator(bytes, maxDepth: maxDepth) == expected,
                "validator, maxDepth \(maxDepth), \(bytes.count) bytes starting \(prefix)")
            #expect(
                Self.parser(bytes, maxDepth: maxDepth) == expected,
                "parse, maxDepth \(maxDepth), \(bytes.count) bytes starting \(prefix)")
            Self.agree(bytes, maxDepth: maxDepth)
        }
        #expect(Self.depthCases.count == 119)
    }

    // MARK: - Mutation fuzz


    static let generatedSeeds: [String] = [
        #"{"id":1,"kind":"listing","items":[{"id":1,"name":"item-1","price":232.04,"in_stock":true,"tags":["b","f"]},{"id":2,"name":"item-2","price":433.41,"in_stock":false,"tags":[]}],"next":null}"#,
        #"[-0,1e308,1.7976931348623157e308,9223372036854775807,-9223372036854775808,4.9e-324,0.5E-3,-12.5e+2]"#,
        #"{"s":"\u00e9\ud83d\ude00\n\t\\\/\"","k\u0001":"é😀日本語","deep":[[[{"a":[]}]]],"z":"\u0000"}"#,
        "[" + belowThreshold + ".9," + "0.000" + belowThreshold + "e312]",
        #"[9223372036854775807,-9223372036854775808,1000000000000000000,"long string of plain ascii text, forty bytes and more"]"#,
        #"{"a":{"b":{"c":{"d":[1,2,{"e":"f"}]}}},"g":[[],[[]],[[[]]]]}"#,
    ]

    @Test func mutationFuzz() throws {
        var seeds: [[UInt8]] = Self.generatedSeeds.map { Self.u($0) }
        let directory = try JSONSuiteFiles.directory()
        for name in try JSONSuiteFiles.names() where name.hasPrefix("y_") {
            seeds.append(try #require(JSONSuiteFiles.read(directory + "/" + name)))
        }
        #expect(seeds.count == 6 + 95)
        let alphabet = Self.u("\"\\[]{}:,-+.eE0123456789u/btnrf \t\n")
        let depths = [-1, 0, 1, 2, 3, 4, 512, 1_000_000]
        var rng = SplitMix(seed: 0x5EED_F00D)
        var cases = 0
        var comparisons = 0
        var accepted = 0
        var mismatches = 0
        for _ in 0..<60_000 {
            var bytes = seeds[rng.below(seeds.count)]
            let edits = 1 + rng.below(4)
            for _ in 0..<edits {
                let position = rng.below(bytes.count + 1)
                let byte: UInt8
                switch rng.below(4) {
                case 0, 1: byte = alphabet[rng.below(alphabet.count)]
                case 2: byte = UInt8(0x80 + rng.below(0x80))  // high bytes
                default: byte = UInt8(rng.below(256))
                }
                switch rng.below(6) {
                case 0 where position < bytes.count: bytes[position] = byte  // replace
                case 1: bytes.insert(byte, at: position)  // insert
                case 2 where position < bytes.count: bytes.remove(at: position)  // delete
                case 3: bytes.removeSubrange(position...)  // truncate
                case 4 where position < bytes.count:  // flip one bit
                    bytes[position] ^= UInt8(1) << UInt8(rng.below(8))
                default:  // duplicate a short run
                    let length = min(1 + rng.below(8), bytes.count - min(position, bytes.count))
                    bytes.insert(contentsOf: bytes[position..<(position + length)], at: position)
                }
            }
            cases += 1
            for maxDepth in [depths[rng.below(depths.count)], 512] {
                comparisons += 1
                let expected = Self.parser(bytes, maxDepth: maxDepth)
                let actual = Self.validator(bytes, maxDepth: maxDepth)
                let marshal = Self.marshalWalk(bytes, maxDepth: maxDepth)
                if expected { accepted += 1 }
                if marshal.valid != actual || (marshal.written && !actual) {
                    mismatches += 1
                    if mismatches <= 20 {
                        Issue.record(
                            "fuzz mismatch, maxDepth \(maxDepth): marshal walk \(marshal), validator \(actual), input hex \(Self.hex(bytes))")
                    }
                }
                if actual != expected {
                    mismatches += 1
                    if mismatches <= 20 {
                        Issue.record(
                            "fuzz mismatch, maxDepth \(maxDepth): validator \(actual), parse \(expected), input hex \(Self.hex(bytes))")
                    }
                }
            }
        }
        #expect(mismatches == 0)
        #expect(cases == 60_000)
        #expect(comparisons == 120_000)
        // Both verdicts are well represented.
        #expect(accepted > 5_000)
        #expect(comparisons - accepted > 10_000)
    }
}
