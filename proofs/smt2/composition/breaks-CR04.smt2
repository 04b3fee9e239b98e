; placement-logic proof obligation: composition/breaks-CR04
; theorem: Composition
; breaking CR04 offload-fetch is refuted
;   statement refuted: A state offloaded off-device is brought back before use (an offloaded Θ needs a fetch or gather path).  [plan: offloaded params never fetched to the device]
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun size_x () Int)
(declare-fun size_microbatches () Int)
(assert
 (>= size_x 1))
(assert
 (<= size_x 2))
(assert
 (>= size_microbatches 1))
(assert
 (<= size_microbatches 2))
(check-sat)
(exit)
