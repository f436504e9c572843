// The end-to-end tests through the built distribution, in a module of their
// own, as the collector core keeps its own: their browser (chromedp, the live
// view's test) and whatever else only they need stay out of the product's
// go.mod. The distribution's module is the one in the repository (replace).
module github.com/otelcol-llm/otelcol-llm/internal/harness/e2e

go 1.26.0

require (
	github.com/chromedp/chromedp v0.24.0
	github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling v0.161.0
	github.com/otelcol-llm/otelcol-llm v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	go.opentelemetry.io/collector/pdata v1.67.0
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.85.0
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/chromedp/cdproto v0.160.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/hashicorp/go-version v1.9.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	go.opentelemetry.io/collector/featuregate v1.67.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/otelcol-llm/otelcol-llm => ../../..
