; placement-logic proof obligation: composition/breaks-CR06
; theorem: Composition
; breaking CR06 sharded-grads-accumulation is refuted
;   statement refuted: Gradients sharded or streamed (S/M) over a data axis combined with pipeline gradient accumulation need one reduce-scatter per microbatch or a full-size accumulation buffer.  [plan: sharded gradients, pipeline accumulation, no accumulation buffer]
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun size_x () Int)
(declare-fun size_y () Int)
(declare-fun size_microbatches () Int)
(assert
 (>= size_x 1))
(assert
 (<= size_x 2))
(assert
 (>= size_y 1))
(assert
 (<= size_y 2))
(assert
 (>= size_microbatches 1))
(assert
 (<= size_microbatches 2))
(assert
 (let (($x0 (>= size_microbatches 2)))
(and true $x0)))
(check-sat)
(exit)
