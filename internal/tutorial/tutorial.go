// Package tutorial holds the Flink tutorial's sensor data that the tests of
// the seed jobs feed through them (docs/jobs.md explains each row).
package tutorial

// Readings are the tutorial's ten readings, "id,epochSeconds,temperature",
// to be keyed by sensor id. At a threshold of 10 they hold exactly three
// alerts (Alerts) and a change of 9.9 → 19.9 that is not one.
var Readings = []string{
	"sensor_1,1547718199,35.8",
	"sensor_6,1547718201,15.4",
	"sensor_7,1547718202,19.9",
	"sensor_10,1547718205,52.6",
	"sensor_1,1547718206,32.4",
	"sensor_6,1547718207,9.9",
	"sensor_1,1547718208,42.4",
	"sensor_10,1547718209,22.5",
	"sensor_6,1547718210,19.9",
	"sensor_7,1547718202,30",
}

// Alerts are temperature-alert's outputs for Readings at threshold 10, in
// input order, each keyed by its sensor id (Alert.ID).
var Alerts = []Alert{
	{"sensor_1", `{"id":"sensor_1","last":32.4,"current":42.4}`},
	{"sensor_10", `{"id":"sensor_10","last":52.6,"current":22.5}`},
	{"sensor_7", `{"id":"sensor_7","last":19.9,"current":30}`},
}

// Alert is one expected output: its key and its value.
type Alert struct {
	ID, Value string
}

// AlertValues are the values of Alerts.
func AlertValues() []string {
	out := make([]string, len(Alerts))
	for i, a := range Alerts {
		out[i] = a.Value
	}
	return out
}
