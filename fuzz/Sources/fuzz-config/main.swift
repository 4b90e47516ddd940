import FuzzTargets

FuzzMain.run(name: "config", ConfigTarget.run)
