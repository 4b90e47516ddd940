// swift-tools-version:6.1
// libFuzzer targets for fetchq (docs/reliability.md, "Fuzzing").
//
//   fuzzing:  swift build -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING
//             .build/debug/fuzz-config corpus/config   (libFuzzer flags follow)
//   replay:   swift build --sanitize=address
//             .build/debug/fuzz-config FILE|DIR...     (each input once)
//
// The same executables do both: built with -DFUZZING their main hands over
// to libFuzzer (LLVMFuzzerRunDriver), built without it they replay inputs.
// `make fuzz` and `make test-fuzz-regressions` drive them through fuzz/run.sh.
import Foundation
import PackageDescription

// A path dependency's identity is its directory's name, which depends on
// where the repository is checked out; compute it instead of hard-coding it.
let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
let rootIdentity = root.lastPathComponent.lowercased()

let settings: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "fetchq-fuzz",
    dependencies: [.package(path: "..")],
    targets: [
        // Declares libFuzzer's LLVMFuzzerRunDriver (only called with -DFUZZING).
        .target(name: "CFuzzerDriver", path: "Sources/CFuzzerDriver"),
        // The three targets and their oracles, shared by fuzzing and replay.
        .target(
            name: "FuzzTargets",
            dependencies: [.product(name: "FetchQ", package: rootIdentity), "CFuzzerDriver"],
            swiftSettings: settings),
        .executableTarget(name: "fuzz-config", dependencies: ["FuzzTargets"], swiftSettings: settings),
        .executableTarget(name: "fuzz-search", dependencies: ["FuzzTargets"], swiftSettings: settings),
        .executableTarget(name: "fuzz-response", dependencies: ["FuzzTargets"], swiftSettings: settings),
    ]
)
